"""``manage.py luanti_install_mod WORLD_DIR``: put the eventsite mod into a Luanti world.

May import: the module's `install`.
"""

from django.core.management.base import BaseCommand, CommandError

from eventsite.luanti.install import InstallError, install


class Command(BaseCommand):
    help = (
        "Install the eventsite mod into a Luanti world: copy it to WORLD_DIR/worldmods/eventsite and "
        "enable it in world.mt (load_mod_eventsite = true). Safe to run again; restart the server after."
    )

    def add_arguments(self, parser):
        parser.add_argument("world_dir", help="the world directory, the one holding world.mt")
        parser.add_argument("--gameid", default="minetest", help="the game, when world.mt has none yet")

    def handle(self, *args, **options):
        try:
            changed = install(options["world_dir"], gameid=options["gameid"])
        except InstallError as exc:
            raise CommandError(str(exc)) from None
        for line in changed:
            self.stdout.write(line)
        if changed:
            self.stdout.write("restart the server so that it loads the mod")
        else:
            self.stdout.write(f"the mod is already installed in {options['world_dir']}: nothing to do")

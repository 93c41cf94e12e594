"""``manage.py create_token USER [--ttl DAYS]``: an API token, printed once (`cleanup.api.tokens.issue`).

May import: `cleanup.api.tokens` and conf: the token's making is theirs, not the command's.
"""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup.api.tokens import issue
from cleanup.conf import BY_NAME, setting

TTL = BY_NAME["EVENT_TOKEN_TTL_DAYS"]


class Command(BaseCommand):
    help = (
        "Make an API token for USER and print it, once: only its digest is stored. It expires after "
        "--ttl days (default EVENT_TOKEN_TTL_DAYS); revoke it in the admin's API tokens."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="the user the token authenticates as")
        parser.add_argument("--ttl", type=int, metavar="DAYS", help=f"days until it expires ({TTL.low}-{TTL.high})")

    def handle(self, *args: Any, username: str, ttl: int | None = None, **options: Any) -> None:
        if ttl is not None and TTL.low is not None and TTL.high is not None and not TTL.low <= ttl <= TTL.high:
            raise CommandError(f"--ttl must be {TTL.low} to {TTL.high} days, not {ttl}")
        user = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"there is no user {username!r}")
        if not user.is_active:
            raise CommandError(f"{username!r} is not active: a token would not authenticate")
        row, key = issue(user, ttl)
        days = setting("EVENT_TOKEN_TTL_DAYS") if ttl is None else ttl
        self.stdout.write(key)
        self.stderr.write(
            f"A token for {username}, expiring {row.expiry:%Y-%m-%d %H:%M} UTC ({days} days). It is shown only "
            "now: keep it as a secret. Revoke it in the admin (API tokens) by its start, "
            f"{row.token_key[:8]}."
        )

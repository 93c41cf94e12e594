"""The Luanti module: events on real Luanti (Minetest) servers, one backend per world.

`eventsite.luanti.module` registers ``luanti.spawn`` and the leases ``luanti.time_speed``
and ``luanti.spawn_rate``; `eventsite.luanti.mailbox` is the channel to the server (a file
mailbox in the world directory, see ``mod/init.lua``); `eventsite.luanti.worlds` reads
``LUANTI_WORLDS``; `eventsite.luanti.install` puts the mod into a world
(``manage.py luanti_install_mod``). docs/luanti.md is the operator's guide.
"""

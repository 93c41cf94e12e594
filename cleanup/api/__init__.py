"""The REST API under ``/api/events/``: one small view per endpoint over the engine.

Every view is a few lines: it reads the request, calls `cleanup.runner`, `cleanup.sweep`
or `cleanup.tasks`, and answers with a serializer from `serializers`. Who may call what is
in `permissions`; the engine's refusals become 404 and 409 here, never anything else.
May import: the engine's entry points (`runner`, `manual`, `plan`, `reconcile`, `outages`,
`sweep`), the models, `validation`, and `tasks` for queueing; nothing of the engine imports it.
"""

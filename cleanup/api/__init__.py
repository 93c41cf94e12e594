"""The REST API under ``/api/v1/events/`` (and the deprecated ``/api/events/``): one small view per
endpoint over the engine.

Every view is a few lines: it reads the request, calls `cleanup.runner`, `cleanup.sweep`
or `cleanup.tasks`, and answers with a serializer from `serializers`. Who may call what is
in `permissions`; the engine's refusals become 404 and 409 here, each with its code (`errors`),
and a query parameter an endpoint does not take is refused (`params`).
May import: the engine's entry points (`runner`, `manual`, `plan`, `reconcile`, `outages`,
`sweep`), the models, `validation`, and `tasks` for queueing; nothing of the engine imports it.
"""

"""`manage.py bench`: how fast the sweep gives back, beside two ways written here.

It measures the real sweep through its public entry (`cleanup.sweep.sweep()`, run in a
sweeper process of its own), and does the same work two more ways with plain psycopg: a
batched plain-SQL sweep (`plain_sql`) and a row-at-a-time port of the original algorithm
(`row_at_a_time`). Every way starts from freshly seeded, identical rows in a scratch
PostgreSQL database (`scratch`, `seed`), against the same in-process module (`module`).

``--night`` (`night`) measures instead how soon runs that end are given back by the
system as deployed: a real sandbox shard and ``manage.py qcluster`` (`processes`), with
runs started and ended through the runner by a driver process (`driver`).

An app of the example site, not of the reusable one: it may import `cleanup`'s models,
conf, registry, runner and sweep, and starts the sandbox shard by module path; nothing in
`cleanup` imports it.
"""

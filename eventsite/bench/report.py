"""The bench's answer, as one JSON line or as a table for a person."""

import json


def json_line(result):
    return json.dumps(result)


def _x(value):
    return "-" if value is None else f"{value:.2f}x"


def _n(value, unit=""):
    return "-" if value is None else f"{value:,.1f}{unit}"


def table(result):
    o, m, f = result["options"], result["machine"], result["finder_ms"]
    lines = [
        _machine(m),
        f"{o['runs']} runs x {o['steps']} steps x {o['resources']} rows: {result['rows']:,} rows in "
        f"{result['groups']:,} groups; history {o['history']:,} resolved rows; module latency {o['latency_ms']} ms; "
        f"medians of {o['repeats']}",
        "",
        f"{'way':<16}{'rows/s':>12}{'statements/group':>18}",
    ]
    for name, label in (("sweep", "the sweep"), ("plain_sql", "plain SQL"), ("row_at_a_time", "row at a time")):
        way = result[name]
        lines.append(f"{label:<16}{_n(way['rows_per_s']):>12}{_n(way['queries_per_group']):>18}")
    lines += [
        "",
        f"the sweep is {_x(result['ratio_to_plain_sql'])} plain SQL and {_x(result['ratio_to_row_at_a_time'])} "
        f"row at a time; its peak RSS {_n(result['sweep']['peak_rss_mb'], ' MB')}",
        f"finder ({result['finder'] or 'not found'}): {_n(f['no_history'], ' ms')} without history, "
        f"{_n(f['with_history'], ' ms')} with it",
    ]
    if "workers" in result:
        w = result["workers"]
        ratio = w["2"] / w["1"] if w["1"] and w["2"] else None
        lines.append(f"sweepers: 1 gives back {_n(w['1'])} rows/s, 2 side by side {_n(w['2'])} rows/s ({_x(ratio)})")
    return "\n".join(lines)


def night_table(result):
    o, m, t = result["options"], result["machine"], result["time_to_clean_ms"]
    broker = result["broker"] + (f", polling every {result['poll_s']:g} s" if result["poll_s"] else "")
    lines = [
        _machine(m),
        f"django-q2 on {broker}, {result['cluster_workers']} workers; the shard answers in {o['latency_ms']} ms "
        "while runs are given back",
        "",
        f"time to clean, idle ({o['samples']} runs of one creature): median {_n(t['median'], ' ms')}, "
        f"p90 {_n(t['p90'], ' ms')}",
        f"  of which queueing the task {_n(t['queued_median'], ' ms')}; a task's own hop through the queue "
        f"{_n(t['queue_hop_median'], ' ms')} (medians)",
    ]
    for key, label in (("night", "big night"), ("long_run", "long run")):
        w = result[key]
        passes = ", ".join(f"{n} by {by}" for by, n in sorted(w["passes"].items(), key=lambda p: str(p[0])))
        lines.append(
            f"{label}: {w['runs']} run(s), {w['groups']:,} groups, {w['rows']:,} rows given back "
            f"{_n(w['seconds'], ' s')} after the last end (median of {o['repeats']}: {w['all']}); passes {passes}"
        )
    return "\n".join(lines)


def fleet_table(result):
    o, m, f = result["options"], result["machine"], result["fleet"]
    h, d, r, e, st = f["healthy"], f["down_shard"], f["idle_restart"], f["engine"], f["start"]
    broker = result["broker"] + (f", polling every {result['poll_s']:g} s" if result["poll_s"] else "")
    return "\n".join(
        [
            _machine(m),
            f"django-q2 on {broker}, {result['cluster_workers']} workers; {f['shards']} shards answering in "
            f"{o['latency_ms']} ms, {f['fleet_down']} down ({f['down']}); {f['runs']} runs x {o['steps']} groups x "
            f"{o['creatures']} rows ({f['spread']}); medians of {o['repeats']}",
            f"shards started together in {_n(st['seconds'], ' s')}; resident memory per shard "
            f"{_n(st['rss_mb_median'], ' MB')} at start, {_n(st['rss_mb_median_at_end'], ' MB')} at the end "
            f"({_n(st['rss_mb_total_at_end'], ' MB')} in all)",
            f"engine: probe every {e['EVENT_OUTAGE_PROBE_S']} s, spread {e['EVENT_OUTAGE_SPREAD_S']} s, "
            f"watch every {e['EVENT_BACKEND_WATCH_S']} s; ticks: {f['ticks']}",
            "",
            f"healthy shards' {f['healthy_rows']:,} rows given back {_n(h['seconds_down'], ' s')} after the last "
            f"end with {f['down']} down {h['all_down']}, {_n(h['seconds_no_shard_down'], ' s')} with none down "
            f"{h['all_no_shard_down']}: {_x(h['ratio'])} (target {h['target_ratio']}x)",
            f"wake tasks sleeping in a worker meanwhile, night by night: {_sleepers(h['wake_tasks_down'])} with "
            f"{f['down']} down, {_sleepers(h['wake_tasks_no_shard_down'])} with none down",
            f"{f['down']}'s {f['down_rows']:,} rows: {d['attempts_spent']} attempts spent (target 0); back "
            f"{_n(d['back_after_end_s'], ' s')} after the last end, its last row given back "
            f"{_n(d['seconds_from_return'], ' s')} after its return {d['all']} (target {d['target_s']} s)",
            f"idle restart of {r['shard']} ({r['rows']} rows back): found {_n(r['found_s'], ' s')} {r['all_found']}, "
            f"given back {_n(r['given_back_s'], ' s')} after the restart {r['all']} (target {r['target_s']} s)",
        ]
    )


def _sleepers(nights):
    """Each night's wake tasks as ``queued-done`` seconds after the last end."""
    return "; ".join(", ".join(f"{t['queued_s']:.1f}-{t['done_s']:.1f} s" for t in night) or "none" for night in nights)


def _machine(m):
    """The machine's line: what it is, and how busy it was (before and after, where both were read)."""
    load = (
        f"{m['load_average_at_start']} before, {m['load_average']} after"
        if "load_average_at_start" in m
        else m["load_average"]
    )
    return f"machine: {m['cpus']} cpus, {m['cpu']}, PostgreSQL {m['postgresql']}, Python {m['python']}, load {load}"


def scrape_table(result):
    o = result["options"]
    lines = [
        _machine(result["machine"]),
        f"a night of {o['runs']} x {o['steps']} x {o['resources']} rows given back and as many live, its backend down "
        f"and each live run's first step failed; history {result['history']:,} resolved rows; medians of "
        f"{o['repeats']} scrapes",
        "",
        f"{'metric':<44}{'no history':>12}{'with history':>14}{'max':>10}{'statements':>12}{'samples':>9}",
    ]
    for name, m in result["metrics"].items():
        lines.append(
            f"{name:<44}{_ms(m['no_history_ms']):>12}{_ms(m['with_history_ms']):>14}"
            f"{_ms(m['with_history_max_ms']):>10}{m['statements']:>12}{m['samples']:>9}"
        )
    s = result["scrape_ms"]
    lines.append(
        f"the whole answer ({result['bytes']:,} bytes): {_n(s['no_history'], ' ms')} without history, "
        f"{_n(s['with_history'], ' ms')} with it"
    )
    return "\n".join(lines)


def prune_table(result):
    o, s, p = result["options"], result["sweep"], result["prune"]
    return "\n".join(
        [
            _machine(result["machine"]),
            f"{result['rows']:,} rows in {result['groups']:,} groups given back by one sweeper; a pruning run of "
            f"{p['runs']:,} runs ({p['rows']:,} rows, {p['batches']} batches of {p['batch']}) beside it; medians of "
            f"{o['repeats']}",
            "",
            f"the sweep alone: {_n(s['alone_rows_per_s'])} rows/s {s['alone']}",
            f"beside the prune: {_n(s['beside_prune_rows_per_s'])} rows/s {s['beside_prune']}: {_x(result['ratio'])}",
            f"the prune took {_n(p['seconds'], ' s')} (median); beside {p['overlap']:.0%} of each sweep at least",
        ]
    )


def _ms(value):
    return "-" if value is None else f"{value:,.2f} ms"

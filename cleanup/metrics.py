"""``GET /metrics``: what staff see in the admin, for Prometheus (its text format).

Gauges are read at scrape time, each from a query on a partial index of unresolved rows or
on a small table, so a scrape costs the same beside a million resolved rows; counters and
the histogram of module calls come from `cleanup.counters`, which every process adds to,
so the answer is the same whichever process serves it. Allowed with ``Authorization:
Bearer <EVENT_METRICS_TOKEN>`` when that is set, else only from loopback.

Every name starts with ``EVENT_METRICS_NAMESPACE`` (a site sets its own name there):
- ``_ledger_rows{state,module,backend}``: unresolved ledger rows (resolved rows are
  counted as they resolve, by ``_sweep_rows_total``);
- ``_runs{status,cleanup_status}``; ``_rows_waiting_for_person``;
  ``_oldest_unresolved_seconds``; ``_backend_up{module,backend}``; ``_alerts_pending``;
  ``_reconciles_owed``, ``_oldest_owed_reconcile_seconds`` (restarts not yet reconciled, rule 14);
- ``_module_calls_total{module,backend,verb,outcome}``, ``_module_call_seconds{module,
  backend,verb}`` (a histogram), ``_sweep_passes_total``, ``_sweep_rows_total{verdict}``.
May import: the models, conf, `cleanup.rows` (what waits for a person), `counters`, `outages`, `tally`.
"""

import hmac
import ipaddress
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence

from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from . import counters, outages, tally
from . import rows as ledger_rows
from .conf import max_revert_attempts, setting
from .models import UNRESOLVED, Alert, Counter, ModuleHealth, ModuleState, Resource

# Each counter's samples by name: its labels (JSON as the counter row keeps them) and value.
Samples = dict[str, list[tuple[dict[str, str], float]]]


def allowed(request: HttpRequest) -> bool:
    """The token when one is set (compared in constant time), else a loopback address."""
    token = setting("EVENT_METRICS_TOKEN")
    if token:
        sent = request.headers.get("Authorization", "")
        return hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        answer = HttpResponse("forbidden: send Authorization: Bearer <EVENT_METRICS_TOKEN>\n", status=403)
        answer["Content-Type"] = "text/plain; charset=utf-8"
        return answer
    # What this process counted is written first, so that it is in this answer.
    counters.flush()
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(Collector(setting("EVENT_METRICS_NAMESPACE")))
    answer = HttpResponse(generate_latest(scrape), content_type=CONTENT_TYPE_LATEST)
    answer["Cache-Control"] = "no-store"
    return answer


class Collector:
    """Reads every figure once per scrape."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    def name(self, short: str) -> str:
        return f"{self.ns}_{short}" if self.ns else short

    def collect(self) -> Iterator[Metric]:
        yield from self.ledger()
        yield self.runs()
        yield from self.backends()
        yield from self.reconciles()
        yield self.alerts()
        yield from self.counted()

    def ledger(self) -> Iterator[Metric]:
        rows = GaugeMetricFamily(
            self.name("ledger_rows"), "Unresolved ledger rows.", labels=["state", "module", "backend"]
        )
        unresolved = Resource.objects.filter(state__in=UNRESOLVED)
        for found in unresolved.values("state", "module", "backend").annotate(n=Count("id")).order_by():
            rows.add_metric([found["state"], found["module"], found["backend"]], found["n"])
        yield rows
        waiting = GaugeMetricFamily(
            self.name("rows_waiting_for_person"),
            "Unresolved rows of ended runs the sweep will not try again: a person retries or waives them.",
        )
        waiting_for_person = ledger_rows.waiting_for_person(timezone.now(), max_revert_attempts())
        waiting.add_metric([], ledger_rows.ended_unresolved().filter(waiting_for_person).count())
        yield waiting
        oldest = unresolved.aggregate(at=Min("created_at"))["at"]
        age = GaugeMetricFamily(
            self.name("oldest_unresolved_seconds"), "Age of the oldest unresolved ledger row (0 when none)."
        )
        age.add_metric([], (timezone.now() - oldest).total_seconds() if oldest else 0)
        yield age

    def runs(self) -> Metric:
        family = GaugeMetricFamily(
            self.name("runs"), "Runs by status and cleanup status.", labels=["status", "cleanup_status"]
        )
        # Every pair, zero where there is none, from the runs' tally (`cleanup.tally`).
        for (status, cleanup_status), n in tally.counts().items():
            family.add_metric([status, cleanup_status], n)
        return family

    def backends(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            self.name("backend_up"),
            "1 when a module's backend is up, 0 while it is down.",
            labels=["module", "backend"],
        )
        for _module, backends in sorted(outages.backends_of(outages.known_modules()).items()):
            for health in backends:
                family.add_metric([health.module, health.backend], 0 if health.state == ModuleState.DOWN else 1)
        yield family

    def reconciles(self) -> Iterator[Metric]:
        """The reconciles backends owe after a restart (`outages.owe_reconcile`), which the
        tick pays: how many, and how long the oldest has waited (0 when none)."""
        owed = ModuleHealth.objects.filter(reconcile_owed_since__isnull=False).aggregate(
            n=Count("id"), since=Min("reconcile_owed_since")
        )
        count = GaugeMetricFamily(
            self.name("reconciles_owed"), "Backends that owe a reconcile after a restart, not yet finished."
        )
        count.add_metric([], owed["n"])
        yield count
        age = GaugeMetricFamily(
            self.name("oldest_owed_reconcile_seconds"),
            "How long the oldest reconcile owed after a restart has waited (0 when none).",
        )
        age.add_metric([], (timezone.now() - owed["since"]).total_seconds() if owed["since"] else 0)
        yield age

    def alerts(self) -> Metric:
        family = GaugeMetricFamily(self.name("alerts_pending"), "Alerts written and not yet delivered.")
        family.add_metric([], Alert.objects.filter(sent_at__isnull=True).count())
        return family

    def counted(self) -> Iterator[Metric]:
        rows = list(Counter.objects.all())
        by_name: Samples = defaultdict(list)
        for row in rows:
            by_name[row.name].append((json.loads(row.labels), row.value))
        calls = CounterMetricFamily(
            self.name("module_calls"),
            "Calls to modules, by how they ended: ok (an answer), error (it raised), timeout.",
            labels=["module", "backend", "verb", "outcome"],
        )
        for labels, value in by_name["module_calls_total"]:
            calls.add_metric([labels.get(k, "") for k in ("module", "backend", "verb", "outcome")], value)
        yield calls
        yield self.histogram(
            by_name, "module_call_seconds", "Seconds a module call took.", ["module", "backend", "verb"]
        )
        passes = CounterMetricFamily(self.name("sweep_passes"), "Cleanup passes made.")
        passes.add_metric([], sum(value for _labels, value in by_name["sweep_passes_total"]))
        yield passes
        verdicts = CounterMetricFamily(
            self.name("sweep_rows"), "Ledger rows the sweep settled, by verdict.", labels=["verdict"]
        )
        for labels, value in by_name["sweep_rows_total"]:
            verdicts.add_metric([labels.get("verdict", "")], value)
        yield verdicts

    def histogram(self, by_name: Samples, short: str, documentation: str, label_names: Sequence[str]) -> Metric:
        family = HistogramMetricFamily(self.name(short), documentation, labels=label_names)
        buckets: defaultdict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
        sums: dict[tuple[str, ...], float] = {}
        for labels, value in by_name[f"{short}_bucket"]:
            key = tuple(labels.get(k, "") for k in label_names)
            buckets[key][labels.get("le", "+Inf")] = value
        for labels, value in by_name[f"{short}_sum"]:
            sums[tuple(labels.get(k, "") for k in label_names)] = value
        for key in sorted(buckets):
            running = 0.0
            cumulative: list[tuple[str, float]] = []
            for bound in (*map(str, counters.BUCKETS), "+Inf"):
                running += buckets[key].get(bound, 0)
                cumulative.append((bound, running))
            family.add_metric(list(key), cumulative, sum_value=sums.get(key, 0))
        return family

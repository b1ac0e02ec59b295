"""The monitoring artifacts (monitoring/: the Grafana dashboard, the Prometheus alert rules and their
promtool unit tests, the scrape configuration; docs/monitoring.md):

* every metric name (and every label name in a selector) a dashboard query, an alert rule or a rule
  test's input series uses is in a real recording: sglang 0.5.17 on an H200
  (tests/fixtures/real-sglang/day2/), the pinned router smg 1.13.0 (tests/fixtures/router-metrics/)
  and Debian 12's node_exporter 1.5.0 (tests/fixtures/node-exporter-metrics/); the name scanner is
  tested on its own, a made-up name included;
* promtool (Debian's prometheus package, fetched and unpacked by scripts/debian-tool.sh, never
  installed) checks the rules and the configuration and runs the rule unit tests; each alert is then
  broken twice (never firing, always firing) to show its unit tests catch both;
* the scrape configuration turns the file_sd targets file playbooks/router.yml writes (the same
  function, sglang_deploy.fleet.router.file_sd) into the jobs the rules and the dashboard select on.

No promtool is a failure, not a skip: scripts/debian-tool.sh fetches it, and when it cannot, the
test fails with its error.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

from sglang_deploy.fleet import router

MONITORING = ROOT / "monitoring"
RULES = MONITORING / "prometheus" / "sglang-alerts.yml"
RULE_TESTS = MONITORING / "prometheus" / "sglang-alerts.test.yml"
SCRAPE = MONITORING / "prometheus" / "scrape-sglang.yml"
DASHBOARD = MONITORING / "grafana" / "sglang-deploy.json"
DEBIAN_TOOL = ROOT / "scripts" / "debian-tool.sh"
TARGETS_PATH = "/etc/prometheus/file_sd/sglang-targets.json"

FIXTURES = ROOT / "tests" / "fixtures"
RECORDINGS = [
    *sorted((FIXTURES / "real-sglang" / "day2").glob("sglang-0.5.17-metrics-*.txt")),
    *sorted((FIXTURES / "router-metrics").glob("metrics-*.txt")),
    FIXTURES / "node-exporter-metrics" / "metrics.txt",
    FIXTURES / "node-exporter-metrics" / "watchdog-textfile.txt",
]
# Series Prometheus makes itself for every target (no exporter serves them).
PROMETHEUS_SERIES = {"up": set()}
# Labels Prometheus attaches to every series of a target: the scrape job and address, and the
# file_sd group's labels (sglang_deploy.fleet.router.file_sd).
TARGET_LABELS = {"job", "instance", "instance_name"}

ALERTS = [
    "SglangTargetDown",
    "SglangNoTokensWhileRequestsWait",
    "SglangTimeToFirstTokenP99High",
    "SglangInterTokenLatencyP99High",
    "SglangKVCacheFullQueueGrowing",
    "SglangRouterWorkerUnhealthy",
    "SglangRouterCircuitOpen",
    "SglangRouterNoHealthyWorker",
    "SglangNodeExporterDown",
    "SglangModelsDiskNearFull",
    "SglangWatchdogGivingUp",
]

# --- the PromQL name scanner ------------------------------------------------------------------

# PromQL's functions and aggregation operators (Prometheus 2.42), and its keywords: identifiers that
# are not metric names. A call to anything not listed fails the scan (a typo'd function).
FUNCTIONS = frozenset(
    """abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min count_over_time
    day_of_month day_of_week day_of_year days_in_month delta deriv exp floor histogram_count
    histogram_fraction histogram_quantile histogram_sum holt_winters hour idelta increase irate
    label_join label_replace last_over_time ln log10 log2 max_over_time min_over_time minute month
    predict_linear present_over_time quantile_over_time rate resets round scalar sgn sort sort_desc
    sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector year acos acosh asin
    asinh atan atanh cos cosh deg pi rad sin sinh tan tanh""".split()
)
AGGREGATIONS = frozenset("sum min max avg group stddev stdvar count count_values bottomk topk quantile".split())
KEYWORDS = frozenset("and or unless by without on ignoring group_left group_right bool offset atan2 inf nan".split())
# Grafana's template functions in variable queries (label_values(EXPR, LABEL) and friends).
GRAFANA_VARIABLE_QUERY = re.compile(r"^\s*(label_values|query_result|metrics|label_names)\((.*)\)\s*$", re.S)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'" + r"|`[^`]*`")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-zA-Z_$]+")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:])(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def promql_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, aggregation
    operators, keywords, label names (in selectors and groupings), numbers or durations. Raises
    ValueError on a call to an unknown function."""
    match = GRAFANA_VARIABLE_QUERY.match(expr)
    if match:
        # label_values(EXPR, LABEL) / label_values(LABEL): only EXPR holds metric names.
        inner = match.group(2)
        expr = inner.rsplit(",", 1)[0] if "," in _STRING.sub('""', inner) else ("" if match.group(1) == "label_values" else inner)
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VARIABLE.sub("", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = _GROUPING.sub(r"\1 ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names: set[str] = set()
    for ident in _IDENT.finditer(text):
        word = ident.group(0)
        called = text[ident.end() :].lstrip().startswith("(")
        if word in KEYWORDS or word in AGGREGATIONS:
            continue
        if called:
            if word not in FUNCTIONS:
                raise ValueError(f"unknown PromQL function {word}() in: {expr}")
            continue
        names.add(word)
    return names


def promql_selector_labels(expr: str) -> dict[str, set[str]]:
    """Metric name -> the label names its selectors match on (``name{label="..."}``)."""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VARIABLE.sub("", text)
    labels: dict[str, set[str]] = {}
    for match in _SELECTOR.finditer(text):
        name = match.group(1)
        if name and name not in KEYWORDS | AGGREGATIONS | FUNCTIONS:
            labels.setdefault(name, set()).update(_MATCHER_LABEL.findall(match.group(2)))
    return labels


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+\S+")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def recorded_series(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Series name -> label names, from Prometheus text pages. A histogram's series are its _bucket,
    _sum and _count (its family name itself is no series)."""
    series: dict[str, set[str]] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            match = _SAMPLE.match(line)
            if match:
                labels = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', match.group(2) or ""))
                series.setdefault(match.group(1), set()).update(labels)
    return series


def recorded_types(paths: Iterable[Path]) -> dict[str, str]:
    types: dict[str, str] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                types[name] = kind
    return types


def unknown_names(exprs: Iterable[str], series: dict[str, set[str]], types: dict[str, str]) -> list[str]:
    """Problems with the names and selector labels ``exprs`` use, against the recorded ``series``:
    a name nobody exports, a histogram used without its _bucket/_sum/_count, a _bucket of a
    non-histogram, a selector on a label the series does not carry."""
    problems: list[str] = []
    known = {**series, **PROMETHEUS_SERIES}
    for expr in exprs:
        for name in sorted(promql_names(expr)):
            if name in known:
                continue
            if types.get(name) == "histogram":
                problems.append(f"{name} is a histogram: select {name}_bucket, _sum or _count ({expr!r})")
                continue
            family = next((name[: -len(s)] for s in _HISTOGRAM_SUFFIXES if name.endswith(s)), None)
            if family and family in types and types[family] != "histogram":
                problems.append(f"{name}: {family} is a {types[family]}, not a histogram ({expr!r})")
            else:
                problems.append(f"{name} is in no recording ({expr!r})")
        for name, labels in promql_selector_labels(expr).items():
            if name in known:
                extra = labels - known[name] - TARGET_LABELS - {"__name__"}
                if extra:
                    problems.append(f"{name} has no label {sorted(extra)} in the recordings ({expr!r})")
    return problems


@pytest.fixture(scope="module")
def series() -> dict[str, set[str]]:
    for path in RECORDINGS:
        assert path.is_file(), f"recording missing: {path}"
    return recorded_series(RECORDINGS)


@pytest.fixture(scope="module")
def types() -> dict[str, str]:
    return recorded_types(RECORDINGS)


def test_scanner_finds_names_and_skips_functions_keywords_labels_and_strings():
    expr = (
        'histogram_quantile(0.99, sum by (job, instance, le) (rate(sglang:time_to_first_token_seconds_bucket'
        '{job=~"sglang-worker", mode="decode"}[5m] offset 1h))) > 1e3 and on (job) up{job="x"} == 0'
        ' unless max without (tp_rank) (sglang:num_queue_reqs) > bool 2'
    )
    assert promql_names(expr) == {"sglang:time_to_first_token_seconds_bucket", "up", "sglang:num_queue_reqs"}
    assert promql_selector_labels(expr) == {"sglang:time_to_first_token_seconds_bucket": {"job", "mode"}, "up": {"job"}}
    # Grafana: variables, $__rate_interval, label_values' label argument.
    assert promql_names('sum(rate(smg_router_requests_total{job=~"$job"}[$__rate_interval]))') == {"smg_router_requests_total"}
    assert promql_names('label_values(up{job=~"$job"}, instance)') == {"up"}
    assert promql_names('label_values(instance)') == set()
    # A string holding something name-like is no name.
    assert promql_names('label_replace(up, "dst", "made_up_metric", "src", "(.*)")') == {"up"}
    with pytest.raises(ValueError, match="rat_e"):
        promql_names("rat_e(up[5m])")


def test_scanner_rejects_a_made_up_name_and_wrong_histogram_suffixes(series, types):
    assert unknown_names(["rate(sglang:prompt_tokens_total[5m])"], series, types) == []
    assert unknown_names(["sglang:time_to_first_token_seconds_bucket"], series, types) == []
    made_up = unknown_names(['sum(rate(sglang:made_up_tokens_total{job="sglang-worker"}[5m]))'], series, types)
    assert len(made_up) == 1 and "sglang:made_up_tokens_total is in no recording" in made_up[0]
    # A histogram's family name is no series; a counter has no buckets.
    assert "is a histogram" in unknown_names(["sglang:inter_token_latency_seconds"], series, types)[0]
    assert "is a counter, not a histogram" in unknown_names(["sglang:prompt_tokens_total_bucket"], series, types)[0]
    # A selector on a label the series does not carry.
    assert "no label ['worker']" in unknown_names(['sglang:num_queue_reqs{worker="x"}'], series, types)[0]
    # The other exporters' names are checked as well.
    assert unknown_names(["smg_worker_cb_state", "node_filesystem_avail_bytes"], series, types) == []
    assert "smg_worker_cb_open is in no recording" in unknown_names(["smg_worker_cb_open"], series, types)[0]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _dashboard_panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for rule in group["rules"]]


def _rule_test_series() -> list[str]:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    return [s["series"] for t in tests for s in t.get("input_series", [])]


def test_every_dashboard_and_rule_name_is_recorded(series, types):
    exprs = _dashboard_exprs(_dashboard()) + [r["expr"] for r in _rules()]
    names = set().union(*(promql_names(e) for e in exprs))
    # The scan sees what the artifacts are about (a vacuous scan would pass too).
    assert {
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:token_usage",
        "smg_worker_health",
        "smg_worker_cb_state",
        "node_filesystem_avail_bytes",
        "up",
    } <= names
    assert unknown_names(exprs, series, types) == []


def test_rule_tests_use_recorded_series_and_labels(series, types):
    inputs = _rule_test_series()
    assert len(inputs) > 20
    assert unknown_names(inputs, series, types) == []


def test_rules_have_for_severity_and_annotations():
    rules = _rules()
    assert [r["alert"] for r in rules] == ALERTS
    for rule in rules:
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]
        assert all(len(str(v).strip()) > 20 for v in rule["annotations"].values()), rule["alert"]


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """promtool from Debian's prometheus package (scripts/debian-tool.sh fetches and unpacks it on the
    first call, under a lock). Its absence is a failure with the fetch's error."""
    bash = shutil.which("bash")
    assert bash, "bash is needed to run scripts/debian-tool.sh"
    return subprocess.run(
        [bash, str(DEBIAN_TOOL), "prometheus", "promtool", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_promtool_checks_the_rules():
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_rule_unit_tests_pass():
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rule_unit_tests_catch_an_alert_that_never_or_always_fires(tmp_path: Path):
    """Each alert has a case where it must fire and one where it must stay quiet: replacing its
    expression by one that never fires, then by one that always fires, fails the unit tests on it.
    One promtool call runs all the broken copies (two per alert) (a test file each, next to its broken rule file)."""
    cases: dict[str, tuple[str, str]] = {}
    for alert in ALERTS:
        for broken, why in (("vector(1) == 0", "never fires"), ("vector(1)", "always fires")):
            doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
            rules = [rule for rule in doc["groups"][0]["rules"] if rule["alert"] == alert]
            assert len(rules) == 1, alert
            rules[0]["expr"] = broken
            case = tmp_path / f"{alert}-{why.replace(' ', '-')}"
            case.mkdir()
            (case / RULES.name).write_text(yaml.safe_dump(doc), encoding="utf-8")
            shutil.copy(RULE_TESTS, case / RULE_TESTS.name)
            cases[str(case / RULE_TESTS.name)] = (alert, why)
    result = _promtool("test", "rules", *cases)
    assert result.returncode != 0, result.stdout + result.stderr
    # promtool reports each file on stdout ("Unit Testing:  FILE", then SUCCESS only if it passed)
    # and each failing file's failures on stderr ("  FAILED:" and the failing alertnames), in order.
    reports = {
        block.split("\n", 1)[0].strip(): block for block in result.stdout.split("Unit Testing:")[1:]
    }
    assert list(reports) == list(cases), result.stdout
    passed = [cases[path] for path, report in reports.items() if "SUCCESS" in report]
    assert passed == [], f"broken alerts whose unit tests still pass: {passed}"
    failures = result.stderr.split("  FAILED:\n")[1:]
    assert len(failures) == len(cases), result.stderr
    for failure, (alert, why) in zip(failures, cases.values()):
        assert f"alertname: {alert}," in failure, f"{alert} {why}: its unit tests fail, but not on it:\n{failure}"


def test_promtool_checks_the_scrape_config():
    result = _promtool("check", "config", str(SCRAPE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is valid prometheus config file syntax" in result.stdout
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def _find_keys(node: Any, keys: set[str]) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys:
                found.append(key)
            found.extend(_find_keys(value, keys))
    elif isinstance(node, list):
        for value in node:
            found.extend(_find_keys(value, keys))
    return found


def test_scrape_config_holds_no_secret_and_reads_the_targets_file():
    config = yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))
    # sglang serves /metrics without the key, the router's metrics port has none: nothing to hold.
    assert _find_keys(config, {"credentials", "password", "bearer_token", "authorization", "basic_auth"}) == []
    files = [f for job in config["scrape_configs"] for sd in job["file_sd_configs"] for f in sd["files"]]
    assert files == [TARGETS_PATH, TARGETS_PATH]
    assert config["rule_files"] == [RULES.name]


def test_scrape_config_turns_file_sd_targets_into_the_jobs_the_rules_use(tmp_path: Path):
    """The targets file as playbooks/router.yml writes it (sglang_deploy.fleet.router.file_sd, through the
    sglang_router_file_sd filter), read by Prometheus' own service discovery and relabelling
    (promtool check service-discovery): workers and routers in job "sglang", node_exporter on each
    worker's address in job "sglang-node"; a worker serving TLS scraped over https (verified with the job's
    tls_config), its node_exporter over plain HTTP."""
    groups = router.file_sd(
        {"glm5-01": "http://10.0.0.11:30000", "glm5-02": "https://[fd00::12]:30000/"},
        {"router-01": "10.0.0.9:29000"},
    )
    targets = tmp_path / "sglang-targets.json"
    targets.write_text(json.dumps(groups), encoding="utf-8")
    config = tmp_path / SCRAPE.name
    config.write_text(SCRAPE.read_text(encoding="utf-8").replace(TARGETS_PATH, str(targets)), encoding="utf-8")
    shutil.copy(RULES, tmp_path / RULES.name)

    def discovered(job: str) -> list[tuple[str, str, str, str, str]]:
        # File discovery answers at once; promtool waits out --timeout whatever happens (default 30 s).
        result = _promtool("check", "service-discovery", "--timeout=5s", str(config), job)
        assert result.returncode == 0, result.stdout + result.stderr
        found = [t["labels"] for t in json.loads(result.stdout) if t["labels"]]
        return sorted((t["job"], t["instance"], t["instance_name"], t["__metrics_path__"], t["__scheme__"]) for t in found)

    assert discovered("sglang") == [
        ("sglang-router", "10.0.0.9:29000", "router-01", "/metrics", "http"),
        ("sglang-worker", "10.0.0.11:30000", "glm5-01", "/metrics", "http"),
        ("sglang-worker", "[fd00::12]:30000", "glm5-02", "/metrics", "https"),
    ]
    assert discovered("sglang-node") == [
        ("sglang-node", "10.0.0.11:9100", "glm5-01", "/metrics", "http"),
        ("sglang-node", "[fd00::12]:9100", "glm5-02", "/metrics", "http"),
    ]
    # The https worker is verified (the CA Prometheus reads for it), never taken on trust.
    job = next(j for j in yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))["scrape_configs"] if j["job_name"] == "sglang")
    assert job["tls_config"] == {"ca_file": "/etc/prometheus/sglang-ca.crt", "insecure_skip_verify": False}


def test_dashboard_is_import_ready_and_templated_on_job_and_instance():
    dashboard = _dashboard()
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert "id" not in dashboard or dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"job", "instance"}
    panels = _dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    datasources = [p["datasource"] for p in panels if "datasource" in p]
    datasources += [t["datasource"] for p in panels for t in p.get("targets", [])]
    datasources += [v["datasource"] for v in variables.values()]
    assert datasources and all(d == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for d in datasources)
    queried = [p for p in panels if p.get("targets")]
    assert len(queried) >= 15
    for panel in queried:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            # Every worker and router query follows the variables; the node_exporter panel is the
            # sglang-node job's, which the variables (workers, routers) do not list.
            if "node_filesystem" not in expr:
                assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, (panel["title"], expr)
    # What the issue asks to see, each in some query.
    exprs = " ".join(_dashboard_exprs(dashboard))
    for wanted in (
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "histogram_quantile(0.99, sum by (le, instance_name) (rate(sglang:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le, instance_name) (rate(sglang:inter_token_latency_seconds_bucket",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "smg_worker_health",
        "smg_worker_cb_state",
        "up{",
    ):
        assert wanted in exprs, wanted

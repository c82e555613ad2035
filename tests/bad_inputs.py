"""A corpus of bad inputs for the CLI, grouped by class (issue 17).

Every case is a set of files to write into a fresh folder, a command line run there,
and a word the one-line error must contain (so the input is refused for the right
reason, not by luck).  ``BASE_FILES`` are a valid graph file, config and plan the
cases start from; ``cases()`` returns them all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

GRAPH = """\
name: base
tensors:
  x: {bytes: 1024, kind: input}
  w0: {bytes: 256, kind: param}
  w1: {bytes: 256, kind: param}
  h0: {bytes: 1024}
  h1: {bytes: 1024}
  y: {bytes: 64}
ops:
  - {name: l0, type: Linear, inputs: [x, w0], outputs: [h0], module: enc.l0}
  - {name: l1, type: Linear, inputs: [h0, w1], outputs: [h1], module: enc.l1}
  - {name: head, type: Sum, inputs: [h1], outputs: [y], module: head}
outputs: [y]
"""

CONFIG = """\
model: {graph: {path: g.yaml}}
devices: [{name: a, capacity: 1MiB}, {name: b, capacity: 1MiB}]
output: {dir: out}
"""

TORCH_CONFIG = """\
model:
  torch:
    factory: "{factory}"
    inputs: [{{shape: [2, 4]}}]
    mode: infer
devices: [{{name: a, capacity: 1MiB}}]
output: {{dir: out}}
"""

BASE_FILES = {"g.yaml": GRAPH, "c.yaml": CONFIG}
"""Files every case folder starts with; ``plan.json`` (the plan of ``c.yaml``) is added by the test."""

PLAN_VERBS = (
    ("verify", ("verify", "plan.json", "--graph", "g.yaml")),
    ("export", ("export", "plan.json", "--format", "split-points")),
    ("report", ("report", "plan.json")),
)


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    argv: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    says: str = ""
    """A word the error line must contain (case-insensitive)."""

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.name}"


def cases(plan: dict) -> list[Case]:
    """Every case; ``plan`` is the valid plan of ``c.yaml`` (as a dict) that plan-file cases corrupt."""
    out: list[Case] = []
    for make in _CLASSES:
        out.extend(make(plan))
    return out


_CLASSES: list[Callable[[dict], Iterator[Case]]] = []


def _class(make: Callable[[dict], Iterator[Case]]) -> Callable[[dict], Iterator[Case]]:
    _CLASSES.append(make)
    return make


def _laughs(width: int, depth: int, indent: str = "") -> str:
    """A billion-laughs document body: each level lists ``width`` aliases of the one before."""
    lines = [f'{indent}l0: &l0 [{", ".join(["lol"] * width)}]']
    for i in range(1, depth + 1):
        lines.append(f'{indent}l{i}: &l{i} [{", ".join([f"*l{i - 1}"] * width)}]')
    return "\n".join(lines) + "\n"


@_class
def alias_bombs(plan: dict) -> Iterator[Case]:
    for width, depth in ((9, 9), (10, 8), (20, 6), (100, 4), (4, 15)):
        yield Case("alias-bomb", f"config-{width}x{depth}", ("plan", "bomb.yaml"),
                   {"bomb.yaml": CONFIG + "x-anchors:\n" + _laughs(width, depth, "  ")}, "alias")
        yield Case("alias-bomb", f"graph-{width}x{depth}", ("inspect", "bomb.yaml"),
                   {"bomb.yaml": GRAPH + _laughs(width, depth)}, "alias")
    yield Case("alias-bomb", "workload", ("plan", "bomb.yaml"),
               {"bomb.yaml": _laughs(10, 9) + CONFIG + "workload: {batch: *l9}\n"}, "alias")
    inline = "{" + _laughs(9, 9).replace("\n", ", ").rstrip(", ") + "}"
    yield Case("alias-bomb", "set-value", ("plan", "c.yaml", "--set", "workload=" + inline),
               {}, "alias")
    yield Case("alias-bomb", "recursive-config", ("plan", "r.yaml"),
               {"r.yaml": CONFIG + "workload: &w {a: *w}\n"}, "alias")
    yield Case("alias-bomb", "recursive-graph", ("inspect", "r.yaml"),
               {"r.yaml": GRAPH.removesuffix("outputs: [y]\n") + "outputs: &o [*o]\n"}, "alias")


@_class
def deep_nesting(plan: dict) -> Iterator[Case]:
    for depth in (65, 1000, 100_000):
        yield Case("deep-nesting", f"config-flow-{depth}", ("plan", "d.yaml"),
                   {"d.yaml": CONFIG + "workload: " + "[" * depth + "]" * depth + "\n"}, "nested")
        yield Case("deep-nesting", f"graph-yaml-{depth}", ("inspect", "d.yaml"),
                   {"d.yaml": GRAPH + "extra: " + "{a: " * depth + "1" + "}" * depth + "\n"}, "nested")
        yield Case("deep-nesting", f"graph-json-{depth}", ("inspect", "d.json"),
                   {"d.json": '{"ops": ' + "[" * depth + "]" * depth + "}"}, "nested")
        yield Case("deep-nesting", f"plan-{depth}", ("export", "p.json", "--format", "split-points"),
                   {"p.json": '{"schema": "mpplan.plan/1", "remat": ' + "[" * depth + "]" * depth + "}"}, "nested")
    block = "".join(f"{'  ' * i}k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n"
    yield Case("deep-nesting", "config-block-200", ("plan", "d.yaml"),
               {"d.yaml": CONFIG + "workload:\n" + _indent(block)}, "nested")
    yield Case("deep-nesting", "set-value", ("plan", "c.yaml", "--set", "workload.batch=" + "[" * 5000 + "]" * 5000),
               {}, "nested")


def _indent(text: str) -> str:
    return "".join("  " + line + "\n" for line in text.splitlines())


_HUGE = "1" * 400


@_class
def huge_integers(plan: dict) -> Iterator[Case]:
    config_values = {
        "capacity": CONFIG.replace("capacity: 1MiB}, {name: b", f"capacity: {_HUGE}}}, {{name: b"),
        "capacity-unit": CONFIG.replace("capacity: 1MiB}, {name: b", f"capacity: {_HUGE} GiB}}, {{name: b"),
        "capacity-decimal": CONFIG.replace("capacity: 1MiB}, {name: b", f"capacity: {_HUGE}.5MB}}, {{name: b"),
        "reserve": CONFIG.replace("capacity: 1MiB}, {name: b", f"capacity: 1MiB, reserve: {_HUGE}}}, {{name: b"),
        "count": CONFIG.replace("{name: a, capacity: 1MiB}", f"{{count: {_HUGE}, capacity: 1MiB}}"),
        "alignment": CONFIG + f"planner: {{alignment: {_HUGE}}}\n",
        "workload": CONFIG + f"workload: {{batch: {_HUGE}}}\n",
        "top-k": CONFIG + f"search: {{top_k: {_HUGE}}}\n",
        "time-limit": CONFIG + f"planner: {{remat: {{time_limit_s: {_HUGE}}}}}\n",
        "5000-digits": CONFIG + f"workload: {{batch: {'9' * 5000}}}\n",
        "infinite-float": CONFIG + "search: {timeout_s: .inf}\n",
        "nan-float": CONFIG + "search: {timeout_s: .nan}\n",
    }
    for name, text in config_values.items():
        yield Case("huge-integer", f"config-{name}", ("plan", "h.yaml"), {"h.yaml": text}, "h.yaml")
    graph_values = {
        "bytes": GRAPH.replace("y: {bytes: 64}", f"y: {{bytes: {_HUGE}}}"),
        "bytes-unit": GRAPH.replace("y: {bytes: 64}", f"y: {{bytes: '{_HUGE} TiB'}}"),
        "shape": GRAPH.replace("y: {bytes: 64}", f"y: {{shape: [{_HUGE}, 2], dtype: float32}}"),
        "shape-product": GRAPH.replace("y: {bytes: 64}", "y: {shape: [4294967296, 4294967296, 8], dtype: float32}"),
        "cost": GRAPH.replace("module: head}", f"module: head, cost: {_HUGE}}}"),
    }
    for name, text in graph_values.items():
        yield Case("huge-integer", f"graph-{name}", ("inspect", "h.yaml"), {"h.yaml": text}, "h.yaml")
    big_plan = json.loads(json.dumps(plan))
    big_plan["devices"][0]["capacity_bytes"] = int(_HUGE)
    yield Case("huge-integer", "plan-capacity", ("verify", "plan.json", "--graph", "g.yaml"),
               {"plan.json": json.dumps(big_plan)}, "plan.json")
    yield Case("huge-integer", "set-capacity", ("plan", "c.yaml", "--set", f"devices.0.capacity={_HUGE}"),
               {}, "capacity")


@_class
def not_utf8(plan: dict) -> Iterator[Case]:
    latin = CONFIG.replace("out", "sortie-\u00e9t\u00e9").encode("latin-1")
    yield Case("not-utf8", "config-latin1", ("plan", "l.yaml"), {"l.yaml": latin}, "UTF-8")
    yield Case("not-utf8", "config-utf16", ("plan", "l.yaml"), {"l.yaml": CONFIG.encode("utf-16")}, "UTF-8")
    yield Case("not-utf8", "graph-yaml", ("inspect", "l.yaml"),
               {"l.yaml": GRAPH.encode("utf-8") + b"\xff\xfe\n"}, "UTF-8")
    yield Case("not-utf8", "graph-json", ("inspect", "l.json"),
               {"l.json": b'{"ops": [], "tensors": {"\xe9": {}}}'}, "UTF-8")
    yield Case("not-utf8", "plan", ("verify", "plan.json", "--graph", "g.yaml"),
               {"plan.json": json.dumps(plan).encode() + b"\x80"}, "UTF-8")
    yield Case("not-utf8", "binary-garbage", ("plan", "l.yaml"), {"l.yaml": bytes(range(256)) * 4}, "UTF-8")


@_class
def duplicate_keys(plan: dict) -> Iterator[Case]:
    yield Case("duplicate-key", "config-top", ("plan", "k.yaml"),
               {"k.yaml": CONFIG + "output: {dir: other}\n"}, "twice")
    yield Case("duplicate-key", "config-nested", ("plan", "k.yaml"),
               {"k.yaml": CONFIG + "planner: {schedule: dfs, assign: auto, schedule: bfs}\n"}, "twice")
    yield Case("duplicate-key", "config-device", ("plan", "k.yaml"),
               {"k.yaml": CONFIG.replace("capacity: 1MiB}, {name: b", "capacity: 1MiB, capacity: 2MiB}, {name: b")},
               "twice")
    yield Case("duplicate-key", "config-workload-block", ("plan", "k.yaml"),
               {"k.yaml": CONFIG + "workload:\n  batch: 8\n  seq: 4\n  batch: 16\n"}, "twice")
    yield Case("duplicate-key", "graph-op-field", ("inspect", "k.yaml"),
               {"k.yaml": GRAPH.replace("type: Sum,", "type: Sum, type: Max,")}, "twice")
    yield Case("duplicate-key", "graph-top", ("inspect", "k.yaml"), {"k.yaml": GRAPH + "name: again\n"}, "twice")
    yield Case("duplicate-key", "plan-json", ("verify", "plan.json", "--graph", "g.yaml"),
               {"plan.json": json.dumps(plan)[:-1] + ', "schedule": []}'}, "twice")
    yield Case("duplicate-key", "set-value", ("plan", "c.yaml", "--set", "workload={a: 1, a: 2}"), {}, "twice")


@_class
def tensor_defined_twice(plan: dict) -> Iterator[Case]:
    yield Case("tensor-twice", "yaml", ("inspect", "t.yaml"),
               {"t.yaml": GRAPH.replace("  y: {bytes: 64}\n", "  y: {bytes: 64}\n  h0: {bytes: 2048}\n")}, "h0")
    yield Case("tensor-twice", "yaml-block", ("inspect", "t.yaml"),
               {"t.yaml": GRAPH.replace("  y: {bytes: 64}\n", "  y:\n    bytes: 64\n  y:\n    bytes: 32\n")}, "twice")
    doc = {"name": "j", "ops": [], "outputs": []}
    text = json.dumps(doc)[:-1] + ', "tensors": {"a": {"bytes": 4}, "a": {"bytes": 8}}}'
    yield Case("tensor-twice", "json", ("inspect", "t.json"), {"t.json": text}, "twice")
    nodelink = {"nodes": [{"id": 0, "name": "a"}, {"id": 0, "name": "b"}], "links": []}
    yield Case("tensor-twice", "node-link", ("inspect", "t.json"), {"t.json": json.dumps(nodelink)}, "twice")
    yield Case("tensor-twice", "via-config", ("plan", "c.yaml"),
               {"g.yaml": GRAPH.replace("  y: {bytes: 64}\n", "  y: {bytes: 64}\n  x: {bytes: 8}\n")}, "twice")


@_class
def device_maps(plan: dict) -> Iterator[Case]:
    maps = {
        "unknown-device": ("{enc: a, head: gpu9}", "gpu9"),
        "unknown-device-only": ("{'': nowhere}", "nowhere"),
        "no-module": ("{enc: a, decoder: b}", "decoder"),
        "prefix-of-name": ("{en: a}", "en"),
        "typo": ("{head: b, enc.l2: a}", "enc.l2"),
    }
    for name, (mapping, says) in maps.items():
        for placement in ("manual", "auto"):
            yield Case("device-map", f"{name}-{placement}", ("plan", "m.yaml"),
                       {"m.yaml": CONFIG + f"planner: {{placement: {placement}, device_map: {mapping}}}\n"}, says)


@_class
def device_counts(plan: dict) -> Iterator[Case]:
    for count in (1025, 200_000, 10**9):
        yield Case("device-count", f"count-{count}", ("plan", "n.yaml"),
                   {"n.yaml": CONFIG.replace("{name: a, capacity: 1MiB}", f"{{count: {count}, capacity: 1MiB}}")},
                   "devices")
    many = ", ".join(f"{{count: 600, kind: k{i}, capacity: 1MiB}}" for i in range(4))
    yield Case("device-count", "several-entries", ("plan", "n.yaml"),
               {"n.yaml": CONFIG.replace("devices: [", f"devices: [{many}, ")}, "devices")
    yield Case("device-count", "set", ("plan", "c.yaml", "--set", "devices=[{count: 200000, capacity: 1GiB}]"),
               {}, "devices")
    yield Case("device-count", "search-axis", ("plan", "n.yaml"),
               {"n.yaml": CONFIG.replace("[{name: a, capacity: 1MiB}, {name: b, capacity: 1MiB}]",
                                         "[{count: 2, capacity: 1MiB}]")
                + "search: {space: {devices.0.count: [2, 200000]}}\n"}, "devices")


_FACTORIES = {
    "raises-runtime": ("def make():\n    raise RuntimeError('weights missing')\n", "weights missing"),
    "raises-value": ("def make():\n    raise ValueError('bad width')\n", "bad width"),
    "raises-keyerror": ("def make():\n    return {}['layers']\n", "KeyError"),
    "returns-int": ("def make():\n    return 42\n", "nn.Module"),
    "returns-none": ("def make():\n    pass\n", "nn.Module"),
    "returns-class": ("import torch\ndef make():\n    return torch.nn.Linear\n", "nn.Module"),
    "syntax-error": ("def make(:\n    return 1\n", "SyntaxError"),
    "import-raises": ("raise RuntimeError('no GPU driver')\ndef make():\n    pass\n", "no GPU driver"),
    "import-missing-dep": ("import not_a_real_package_xyz\ndef make():\n    pass\n", "not_a_real_package_xyz"),
    "not-callable": ("make = 3\n", "callable"),
    "wrong-kwargs": ("def make(width):\n    pass\n", "width"),
    "forward-raises": ("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                       "        raise RuntimeError('forward is broken')\n"
                       "def make():\n    return M()\n", "forward is broken"),
}


@_class
def factories(plan: dict) -> Iterator[Case]:
    for name, (source, says) in _FACTORIES.items():
        module = "userfac_" + name.replace("-", "_")
        config = TORCH_CONFIG.format(factory=f"{module}:make")
        for verb in ("inspect", "plan"):
            yield Case("factory", f"{name}-{verb}", (verb, "f.yaml"), {"f.yaml": config, f"{module}.py": source}, says)
    yield Case("factory", "missing-module", ("plan", "f.yaml"),
               {"f.yaml": TORCH_CONFIG.format(factory="no_such_mod_q:make")}, "no_such_mod_q")


def _plan_variants(plan: dict) -> Iterator[tuple[str, str | bytes, str]]:
    """(name, plan.json text, word the error names) for malformed plans."""
    text = json.dumps(plan, indent=1)
    for key in ("schema", "graph", "devices", "schedule", "buffers"):
        broken = {k: v for k, v in plan.items() if k != key}
        yield f"missing-{key}", json.dumps(broken), key
    wrong_types = {
        "devices-not-list": ("devices", {"a": 1}),
        "schedule-ints": ("schedule", [1, 2, 3]),
        "buffers-list": ("buffers", [1]),
        "placement-list": ("placement", ["a"]),
        "copies-strings": ("copies", ["x"]),
        "predicted-string": ("predicted", "big"),
        "remat-mapping": ("remat", {"a": 1}),
        "module-devices-ints": ("module_devices", {"enc": 1}),
        "graph-string": ("graph", "base"),
        "schema-other": ("schema", "mpplan.plan/99"),
    }
    for name, (key, value) in wrong_types.items():
        yield name, json.dumps({**plan, key: value}), key.split("-")[0]
    first = plan["devices"][0]
    nameless = {k: v for k, v in first.items() if k != "name"}
    yield "device-capacity-string", json.dumps({**plan, "devices": [{**first, "capacity_bytes": "1M"}]}), "capacity"
    yield "device-name-missing", json.dumps({**plan, "devices": [nameless]}), "name"
    overhead = {**plan["predicted"], "compute_overhead": "x"}
    yield "overhead-string", json.dumps({**plan, "predicted": overhead}), "compute_overhead"
    yield "seconds-list", json.dumps({**plan, "planner": {"settings": {}, "seconds": [1]}}), "seconds"
    yield "placement-values-ints", json.dumps({**plan, "placement": {"l0": 1}}), "placement"
    for where, cut in (("start", 1), ("third", len(text) // 3), ("half", len(text) // 2), ("end", len(text) - 2)):
        yield f"truncated-{where}", text[:cut], "JSON"
    yield "empty", "", "JSON"
    yield "top-level-list", "[]", "mapping"
    yield "null", "null", "mapping"


@_class
def malformed_plans(plan: dict) -> Iterator[Case]:
    for name, text, says in _plan_variants(plan):
        for verb, argv in PLAN_VERBS:
            yield Case("malformed-plan", f"{name}-{verb}", argv, {"plan.json": text}, says)
    other = GRAPH.replace("y: {bytes: 64}", "y: {bytes: 128}")
    yield Case("malformed-plan", "another-graph-verify", ("verify", "plan.json", "--graph", "other.yaml"),
               {"other.yaml": other}, "plan it again")


@_class
def corrupt_report_folders(plan: dict) -> Iterator[Case]:
    good = json.dumps(plan)
    files = {
        "timeline-truncated": {"timeline.json": '{"steps": [1, 2'},
        "timeline-wrong-shape": {"timeline.json": '{"steps": [], "devices": [{"name": 1}]}'},
        "timeline-list": {"timeline.json": "[1, 2]"},
        "baselines-strings": {"baselines.json": '{"eager": "big"}'},
        "measurement-list": {"measurement.json": "[]"},
        "measurement-wrong-shape": {"measurement.json": '{"devices": [{"name": "a"}]}'},
        "measurement-not-utf8": {"measurement.json": b'{"devices": "\xff"}'},
        "results-bad-line": {"results.jsonl": '{"schema": 1}\n', "best/plan.json": good},
        "results-truncated": {"results.jsonl": '{"sch', "best/plan.json": good},
        "results-no-best": {"results.jsonl": ""},
        "best-plan-corrupt": {"results.jsonl": "", "best/plan.json": good[:40]},
        "result-json-list": {"results.jsonl": "", "best/plan.json": good, "best/result.json": "[]"},
    }
    for name, extra in files.items():
        yield Case("corrupt-report", name, ("report", "."), {"plan.json": good, **extra}, "")


@_class
def other_classes(plan: dict) -> Iterator[Case]:
    """Classes the issue did not list, found probing."""
    yield Case("other", "set-bad-yaml", ("plan", "c.yaml", "--set", "workload={a: [1"), {}, "--set")
    yield Case("other", "set-no-equals", ("plan", "c.yaml", "--set", "workload"), {}, "--set")
    yield Case("other", "config-is-folder", ("plan", "folder.yaml"), {"folder.yaml/x": "1"}, "folder.yaml")
    yield Case("other", "config-empty", ("plan", "e.yaml"), {"e.yaml": ""}, "model")
    yield Case("other", "config-scalar", ("plan", "e.yaml"), {"e.yaml": "42\n"}, "mapping")
    yield Case("other", "config-python-tag", ("plan", "e.yaml"),
               {"e.yaml": "!!python/object/apply:os.system [ls]\n"}, "YAML")
    yield Case("other", "config-two-documents", ("plan", "e.yaml"), {"e.yaml": CONFIG + "---\n" + CONFIG}, "YAML")
    yield Case("other", "config-nul-bytes", ("plan", "e.yaml"), {"e.yaml": CONFIG + "\x00\n"}, "YAML")
    yield Case("other", "graph-path-escapes", ("plan", "e.yaml"),
               {"e.yaml": CONFIG.replace("g.yaml", "../../../../nope.yaml")}, "not found")
    yield Case("other", "out-is-a-file", ("plan", "c.yaml", "--out", "g.yaml"), {}, "g.yaml")
    yield Case("other", "graph-key-not-string", ("inspect", "e.yaml"),
               {"e.yaml": GRAPH.replace("  y: {bytes: 64}", "  1: {bytes: 64}")}, "e.yaml")
    yield Case("other", "graph-binary-tag", ("inspect", "e.yaml"),
               {"e.yaml": GRAPH.replace("name: base", "name: !!binary aGVsbG8=")}, "name")
    yield Case("other", "graph-timestamp-bytes", ("inspect", "e.yaml"),
               {"e.yaml": GRAPH.replace("bytes: 64", "bytes: 2001-12-14")}, "bytes")
    yield Case("other", "graph-set-ops", ("inspect", "e.yaml"),
               {"e.yaml": "name: s\ntensors: {}\nops: !!set {a, b}\n"}, "ops")
    synthetic = "model: {{synthetic: {{kind: {kind}, {args}}}}}\ndevices: [{{name: a, capacity: 1GiB}}]\n"
    for kind, args, says in (
        ("chain", "n: 100000000", "synthetic.n"),
        ("transformer", "layers: 10000000", "synthetic.layers"),
        ("chain", "n: 4, batch: 4611686018427387904, width: 4611686018427387904", "2**62"),
        ("random_layered", "n: 10, min_bytes: 4611686018427387904, max_bytes: 4611686018427387904", "2**62"),
    ):
        yield Case("other", f"synthetic-{kind}-{says}", ("plan", "s.yaml"),
                   {"s.yaml": synthetic.format(kind=kind, args=args)}, says)
    huge_input = (TORCH_CONFIG.format(factory="mpplan.zoo.mlp:mlp").replace("[2, 4]", "[batch, 64]")
                  + "workload: {batch: 4611686018427387904}\n")
    yield Case("other", "torch-input-overflow", ("plan", "t.yaml"), {"t.yaml": huge_input}, "2**62")
    many = "".join(f"  t{i}: {{bytes: 4611686018427387904, kind: param}}\n" for i in range(4))
    yield Case("other", "graph-total-bytes", ("inspect", "t.yaml"),
               {"t.yaml": GRAPH.replace("tensors:\n", "tensors:\n" + many)}, "2**62")
    yield Case("other", "newline-in-key", ("plan", "n.yaml"),
               {"n.yaml": CONFIG + 'planner: {"sched\\nule": dfs}\n'}, "sched")
    yield Case("other", "newline-in-file-name", ("plan", "bad\nname.yaml"), {}, "not found")
    yield Case("other", "search-fit-value", ("search", "c.yaml"),
               {"c.yaml": CONFIG + "search: {space: {planner.schedule: [dfs]}, fit: loop}\n"}, "search.fit")
    yield Case("other", "search-fit-apply-graph", ("search", "c.yaml"),
               {"c.yaml": CONFIG + "search: {space: {planner.schedule: [dfs]}, fit: apply}\n"}, "search.fit")
    yield Case("other", "search-step-in-backward-value", ("search", "c.yaml"),
               {"c.yaml": CONFIG + "search: {space: {planner.schedule: [dfs]}, step_in_backward: maybe}\n"},
               "search.step_in_backward")
    yield Case("other", "search-step-in-backward-fit-plan", ("search", "c.yaml"),
               {"c.yaml": CONFIG + "search: {space: {planner.schedule: [dfs]}, step_in_backward: true}\n"},
               "search.step_in_backward")
    yield Case("other", "results-not-json-search", ("search", "c.yaml", "--resume", "--out", "o"),
               {"c.yaml": CONFIG + "search: {space: {planner.schedule: [dfs]}, top_k: 0}\n",
                "o/results.jsonl": "nope\n"}, "results.jsonl")

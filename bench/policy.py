"""Policy v0 benchmark: parse time and decisions per second against the targets of SPEC §5.

Targets (issue "Policy v0 and the six-step authority chain"): a 10 000-rule policy parses in
under 100 ms, and the pure decision (one set lookup) runs at 1 000 000 decisions/s or more,
in process.  Each figure is the best of several runs, reported with its ratio to the target.

For context it also times the whole authority chain (``check_tool_execute``: six steps over a
real storage root, reading and parsing the controls each time) with a small agent policy and
with the 10 000-rule one.  The chain has no target; it shows what a tool call pays.

Usage: python bench/policy.py [--rules N] [--decisions N] [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cortexfs.policy import CLASS_PERMISSIONS, Credentials, Policy, Rule, check_tool_execute
from cortexfs.storage import ensure_root_abi

PARSE_TARGET_MS = 100.0
DECISION_TARGET_PER_S = 1_000_000
AGENT_UID = AGENT_GID = 65534  # the chain never needs this uid to exist; it judges mode bits


def generate_rules(count: int, seed: int = 6) -> list[Rule]:
    """``count`` distinct rules over every class, 100 subject types and realistic names."""
    chooser = random.Random(seed)
    classes = sorted(CLASS_PERMISSIONS)
    rules: set[Rule] = set()
    while len(rules) < count:
        object_class = chooser.choice(classes)
        number = chooser.randrange(count)
        if object_class == "network":
            name = "default"
        elif object_class == "model":
            name = f"provider-{number % 20}/model-{number}"
        else:
            name = f"{object_class}-{number}.v{number % 7}"
        permission = chooser.choice(CLASS_PERMISSIONS[object_class])
        rules.add(Rule(f"agent-{chooser.randrange(100)}_t", object_class, name, permission))
    return sorted(rules)


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return min(timings)


def measure_parse(text: str, repeat: int) -> dict[str, float]:
    data = text.encode()
    text_ms = best_seconds(lambda: Policy.from_text(text), repeat) * 1000
    bytes_ms = best_seconds(lambda: Policy.from_bytes(data), repeat) * 1000
    return {
        "parse_text_ms": text_ms,
        "parse_bytes_ms": bytes_ms,
        "parse_target_ratio": PARSE_TARGET_MS / max(text_ms, bytes_ms),
    }


def measure_decisions(
    policy: Policy, rules: list[Rule], count: int, repeat: int
) -> dict[str, float]:
    """Half the questions hit a rule, half miss by one word (the costlier path for a set)."""
    chooser = random.Random(7)
    questions = []
    for index in range(count):
        subject, object_class, name, permission = chooser.choice(rules)
        if index % 2:
            name = f"{name}-absent"
        questions.append((subject, object_class, name, permission))
    allows = policy.allows

    def decide_all() -> None:
        for subject, object_class, name, permission in questions:
            allows(subject, object_class, name, permission)

    per_second = count / best_seconds(decide_all, repeat)
    return {
        "decisions_per_s": per_second,
        "decision_target_ratio": per_second / DECISION_TARGET_PER_S,
    }


def measure_chain(agent_policy: str, count: int) -> float:
    """Full chains per second for one agent and one tool in a fresh storage root."""
    parent = Path(tempfile.mkdtemp(prefix="cortexfs-bench-"))
    parent.chmod(0o755)  # mkdtemp's 0700 would keep the agent's uid out (step 2)
    try:
        root = parent / "storage"
        ensure_root_abi(root)
        controls = root / "agent" / "bench.d"
        controls.mkdir()
        (root / "agent" / "bench").write_text("#!/bin/sh\n")
        identity = {"uid": AGENT_UID, "gid": AGENT_GID, "groups": []}
        (controls / "identity").write_text(json.dumps(identity))
        (controls / "label").write_text("bench_t\n")
        (controls / "mount").write_text(json.dumps([[str(root), "/ctx", "ro"]]))
        grants = "allow bench_t mount:ctx read\nallow bench_t tool:fs.read execute\n"
        (controls / "policy").write_text(agent_policy + grants)
        tool = root / "tool" / "fs.read"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
        (root / "tool" / "fs.read.d").mkdir()
        (root / "tool" / "fs.read.d" / "policy").write_text("allow bench_t tool:fs.read execute\n")
        caller = Credentials(AGENT_UID, AGENT_GID)
        assert check_tool_execute(root, "bench", "fs.read", caller).allowed
        started = time.perf_counter()
        for _ in range(count):
            check_tool_execute(root, "bench", "fs.read", caller)
        return count / (time.perf_counter() - started)
    finally:
        shutil.rmtree(parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=10_000, help="rules in the policy")
    parser.add_argument("--decisions", type=int, default=1_000_000, help="decisions per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best one counts")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args()

    rules = generate_rules(options.rules)
    text = "".join(f"{rule}\n" for rule in rules)
    policy = Policy.from_text(text)
    assert len(policy) == options.rules
    figures: dict[str, float] = {"rules": options.rules}
    figures |= measure_parse(text, options.repeat)
    figures |= measure_decisions(policy, rules, options.decisions, options.repeat)
    figures["chain_small_policy_per_s"] = measure_chain("", 2_000)
    figures["chain_large_policy_per_s"] = measure_chain(text, 20)

    if options.json:
        print(json.dumps(figures))
        return
    print(f"policy of {options.rules} rules")
    print(
        f"  parse (text)      {figures['parse_text_ms']:8.1f} ms"
        f"   (bytes {figures['parse_bytes_ms']:.1f} ms)"
        f"   target < {PARSE_TARGET_MS:.0f} ms: {figures['parse_target_ratio']:.1f}x under"
    )
    print(
        f"  decisions         {figures['decisions_per_s']:12,.0f} /s"
        f"   target >= {DECISION_TARGET_PER_S:,}/s: {figures['decision_target_ratio']:.1f}x"
    )
    print("full authority chain (check_tool_execute, six steps, controls re-read each call)")
    print(f"  small agent policy  {figures['chain_small_policy_per_s']:10,.0f} /s")
    print(f"  {options.rules}-rule policy   {figures['chain_large_policy_per_s']:10,.1f} /s")


if __name__ == "__main__":
    main()

"""Models and providers end to end (SPEC R-3, A-3, P-3, P-5, P-8, S-3, F-1, T-5, D-1).

How a model lives in the storage root (``model/<provider>/<model>``, its own
``model/<provider>/<model>.d/policy``, the reserved ``.d/log``: S-3, ctx.model.md,
ctx.provider.md), what the agent request's ``model`` list becomes (A-3), model names at the
edges of R-3, and ``model:<provider>/<model> use`` through the six steps of the chain (P-3,
P-5): an agent made for models that do not exist yet, models removed, moved to another
provider or damaged after the agent was made (their policy missing, unreadable, a link, a
directory, invalid, too big, not host-owned ...).  For each condition ``ctx policy explain``
and the agent's view must agree: the projection ``ctx agent show --json`` reports for its
tools' ``CTX_MOUNTS``, a real ``ctx mount --as`` FUSE view and ``fs.list`` run as the agent
list a model exactly when the chain lets the agent use it (F-1, T-5).  Nothing creates or
writes a model's log, and ``ctx bootstrap`` leaves the host's models alone (S-3, R-5).  A
non-root host administrator is exercised through the test user.

Everything goes through the installed ``ctx`` on scratch storage roots below
``/tmp/<this file's stem>-<uid>/``; FUSE mounts are unmounted at the end of each test.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
AGENT, LABEL = "coder", "coder_t"
NOBODY = 65534  # the uid root's agents run as by default
MODEL = "openai/gpt-5.6"
POLICY_LIMIT = 16 * 1024 * 1024  # docs/policy.md: a policy holds at most 16 MiB
LONG_PROVIDER = "p" + "-" * 62 + "P"  # 64 bytes
LONG_MODEL = "m." + "9" * 61 + "M"  # 64 bytes


def rule(model: str, label: str = LABEL) -> str:
    return f"allow {label} model:{model} use"


# ---------------------------------------------------------------------------------- helpers


@dataclass
class World:
    """A scratch directory (0755) holding a bootstrapped storage root ``storage``."""

    top: Path

    @property
    def root(self) -> Path:
        return self.top / "storage"

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def create(self, models: list[str], name: str = AGENT, label: str = LABEL, **more) -> Run:
        request = {"name": name, "label": label, "model": models, **more}
        return self.ctx("agent", "create", "-", "--json", input=json.dumps(request))

    def made(self, models: list[str], **more) -> dict:
        made = self.create(models, **more)
        assert made.rc == 0 and TRACEBACK not in made.err, made
        return made.json()

    def add_model(self, name: str, own_policy: str | None = None) -> Path:
        """``model/<name>`` (a 0644 file) and ``model/<name>.d/policy`` holding ``own_policy``
        (default: coder_t's rule for it), as the host administrator makes them by hand
        (ctx.model.md)."""
        entry = self.root / "model" / name
        control = entry.with_name(entry.name + ".d")
        control.mkdir(parents=True, exist_ok=True)
        entry.write_text("{}\n")
        entry.chmod(0o644)
        text = rule(name) + "\n" if own_policy is None else own_policy
        (control / "policy").write_text(text)
        (control / "policy").chmod(0o644)
        return entry

    def explain(self, model: str, agent: str = AGENT) -> Run:
        return self.ctx("policy", "explain", agent, f"model:{model}", "use", "--json")

    def shown(self, agent: str = AGENT) -> dict[str, list[str]]:
        """The models the agent's projection lists, by provider, as its tools get them in
        ``CTX_MOUNTS`` (``ctx agent show --json``, ``tool_mounts``)."""
        shown = self.ctx("agent", "show", agent, "--json")
        assert shown.rc == 0 and TRACEBACK not in shown.err, shown
        mounts = {entry[1]: entry for entry in shown.json()["tool_mounts"]}
        top = mounts.get("/ctx/model")
        if top is None:
            return {}
        return {p: list(mounts[f"/ctx/model/{p}"][3]) for p in top[3]}


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w")
    try:
        copy_of_root(_template, top / "storage")
        yield World(top)
    finally:
        with open("/proc/self/mountinfo") as table:
            points = [line.split()[4] for line in table]
        for where in points:
            if where.startswith(str(top)):  # a mount a failed assertion left behind
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


def decision(run: Run) -> dict:
    """``ctx policy explain --json``'s answer, checked for a clean exit status."""
    assert TRACEBACK not in run.err, run
    answer = run.json()
    assert run.rc == (0 if answer["allowed"] else 1), run
    return answer


def denial(run: Run) -> tuple[int, str, str]:
    """The denying step, its errno and reason of an explain that must deny."""
    answer = decision(run)
    assert not answer["allowed"], run
    return answer["step"], answer["errno"], answer["reason"]


# ----------------------------------------------------------- names in a request


def test_model_names_at_the_r3_edges_become_the_model_control_and_exact_rules(
    world: World,
) -> None:
    """A-3, R-3, P-3, P-7 (ctx.model.md *The agent's model control*): names with dots,
    dashes and underscores in both parts, one-byte parts and 64-byte parts are legal; the
    request's list becomes ``agent/coder.d/model`` (one name per line, as listed) and one
    ``allow coder_t model:<p>/<m> use`` each, which ``ctx policy check`` accepts and
    ``ctx policy query`` answers together with each model's own policy (P-8)."""
    models = ["local/llama-3.1-8b", "a.b-c_d/e.f.g-1", "9/9", f"{LONG_PROVIDER}/{LONG_MODEL}"]
    made = world.made(models)
    assert made["warnings"] == [], made
    controls = world.root / "agent" / f"{AGENT}.d"
    assert (controls / "model").read_text() == "".join(f"{m}\n" for m in models)
    granted = [line for line in (controls / "policy").read_text().splitlines() if "model:" in line]
    assert granted == [rule(m) for m in models]
    checked = world.ctx("policy", "check", controls / "policy")
    assert (checked.rc, checked.err) == (0, ""), checked

    for model in models:
        own = world.add_model(model).with_name(Path(model).name + ".d") / "policy"
        layers = ["--policy", controls / "policy", "--policy", own]
        asked = world.ctx("policy", "query", *layers, LABEL, f"model:{model}", "use")
        assert (asked.rc, asked.out) == (0, "allow\n"), asked
        assert decision(world.explain(model))["allowed"], model
    assert world.shown() == {
        "9": ["9", "9.d"],
        "a.b-c_d": ["e.f.g-1", "e.f.g-1.d"],
        "local": ["llama-3.1-8b", "llama-3.1-8b.d"],
        LONG_PROVIDER: [LONG_MODEL, f"{LONG_MODEL}.d"],
    }


ILLEGAL_MODEL_NAMES = [
    f"{LONG_PROVIDER}x/m",  # provider of 65 bytes
    f"p/{LONG_MODEL}x",  # model of 65 bytes
    "openai/gpt.d",
    "openai.d/gpt",
    "openai/..",
    "openai/.",
    "openai/.hidden",
    "openai/-x",
    "openai/",
    "/gpt",
    "openai/gpt 5",
    "openai/gpt\u00e9",
    "openai//gpt",
    "openai/gpt*",
]


def test_every_illegal_model_name_is_named_and_the_whole_request_refused(world: World) -> None:
    """R-3 (each part of a model name an object name; anything else EINVAL), A-3: a request
    listing one legal model and each illegal one is refused with EINVAL naming every illegal
    name (not the legal one), and no agent entry or control is left behind; ``ctx policy
    explain`` of each illegal name is a malformed request (exit 2, EINVAL)."""
    refused = world.create(["openai/gpt-5.6", *ILLEGAL_MODEL_NAMES])
    assert refused.rc != 0 and TRACEBACK not in refused.err, refused
    assert refused.err.startswith("ctx: EINVAL: "), refused
    for name in ILLEGAL_MODEL_NAMES:
        assert f"model:{name[:20]}" in refused.err, (name, refused)
    assert "model:openai/gpt-5.6:" not in refused.err, refused
    assert not (world.root / "agent" / AGENT).exists()
    assert not (world.root / "agent" / f"{AGENT}.d").exists()
    world.made(["openai/gpt-5.6"])
    for name in ILLEGAL_MODEL_NAMES:
        asked = world.ctx("policy", "explain", AGENT, f"model:{name}", "use")
        assert asked.rc == 2 and "EINVAL" in asked.err and TRACEBACK not in asked.err, asked


def test_a_model_takes_no_location_and_no_other_permission(world: World) -> None:
    """P-3 (model has only ``use``), ctx.model.md: a model lives in one place, so
    ``--location`` is EINVAL, as is ``execute`` or ``read`` on a model (exit 2)."""
    world.made([MODEL])
    world.add_model(MODEL)
    for extra in (
        ["use", "--location", "tool"],
        ["execute"],
        ["read"],
    ):
        asked = world.ctx("policy", "explain", AGENT, f"model:{MODEL}", *extra)
        assert asked.rc == 2 and "EINVAL" in asked.err and TRACEBACK not in asked.err, asked


# ----------------------------------------------- A-3, P-5, F-1: models that do not exist


def test_an_agent_made_for_absent_models_gains_each_when_the_host_adds_it(world: World) -> None:
    """A-3, P-5 step 2 (a missing object is ENOENT), F-1: an agent may be made for models
    that do not exist yet (ctx.model.md: nothing creates model entries; the host adds them
    by hand).  Until then ``explain`` denies with ENOENT at step 2 and the view lists no
    model; once the host adds one model with its policy, that model alone is allowed and
    listed, with no change to the agent."""
    world.made([MODEL, "local/llama-3.1-8b"])
    for model in (MODEL, "local/llama-3.1-8b"):
        step, code, reason = denial(world.explain(model))
        assert (step, code) == (2, "ENOENT") and "does not exist" in reason, reason
    assert world.shown() == {}

    world.add_model(MODEL)
    assert decision(world.explain(MODEL))["allowed"]
    assert denial(world.explain("local/llama-3.1-8b"))[:2] == (2, "ENOENT")
    assert world.shown() == {"openai": ["gpt-5.6", "gpt-5.6.d"]}


def test_a_rule_in_one_models_policy_grants_no_other_model(world: World) -> None:
    """P-5 step 6, P-7 (grants by concrete name): each model is judged by its own
    ``.d/policy``; a rule for ``gpt-5.7`` written in ``gpt-5.6``'s policy grants nothing,
    and neither does a model's policy when the agent's own lacks the rule (step 5)."""
    world.made([MODEL, "openai/gpt-5.7"])
    world.add_model(MODEL, rule(MODEL) + "\n" + rule("openai/gpt-5.7") + "\n")
    world.add_model("openai/gpt-5.7", "# nothing here\n")
    world.add_model("openai/o9")  # its own policy grants coder_t; coder's does not
    assert decision(world.explain(MODEL))["allowed"]
    step, code, reason = denial(world.explain("openai/gpt-5.7"))
    assert (step, code) == (6, "EACCES") and "gpt-5.7.d/policy" in reason, reason
    assert denial(world.explain("openai/o9"))[:2] == (5, "EACCES")
    assert world.shown() == {"openai": ["gpt-5.6", "gpt-5.6.d"]}


def test_moving_a_model_to_another_provider_makes_it_another_model(world: World) -> None:
    """ctx.provider.md (*Moving a model to another provider changes its name, so its rules,
    the agents' model controls and its own policy must all be written again*), P-5: after
    the host moves ``openai/gpt-5.6`` to ``azure/``, the old name is ENOENT; the new name is
    denied at step 5 until the agent's policy names it, then at step 6 until the model's own
    policy does; only then is it listed, under ``azure``."""
    world.made([MODEL])
    world.add_model(MODEL)
    assert world.shown() == {"openai": ["gpt-5.6", "gpt-5.6.d"]}
    (world.root / "model" / "azure").mkdir(mode=0o755)
    for name in ("gpt-5.6", "gpt-5.6.d"):
        os.rename(world.root / "model" / "openai" / name, world.root / "model" / "azure" / name)
    moved = "azure/gpt-5.6"

    assert denial(world.explain(MODEL))[:2] == (2, "ENOENT")
    assert denial(world.explain(moved))[:2] == (5, "EACCES")
    with open(world.root / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        policy.write(rule(moved) + "\n")
    step, _, reason = denial(world.explain(moved))
    assert step == 6 and f"no rule '{rule(moved)}'" in reason, reason
    assert world.shown() == {}
    (world.root / "model" / "azure" / "gpt-5.6.d" / "policy").write_text(rule(moved) + "\n")
    assert decision(world.explain(moved))["allowed"]
    assert world.shown() == {"azure": ["gpt-5.6", "gpt-5.6.d"]}


# ----------------------------------------- P-5, F-1: a model damaged after the agent's made


def _policy(world: World) -> Path:
    return world.root / "model" / "openai" / "gpt-5.6.d" / "policy"


def _replace_with_link(path: Path) -> None:
    os.rename(path, path.with_name(path.name + ".real"))
    path.symlink_to(path.name + ".real")


def _replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _oversize(path: Path) -> None:
    with open(path, "ab") as policy:
        policy.write(b"#" * POLICY_LIMIT + b"\n")


def _remove_provider(world: World) -> None:
    shutil.rmtree(world.root / "model" / "openai")


DAMAGES = {
    # name: (damage, denying step, errno, a fragment of the reason)
    "policy removed": (lambda w: _policy(w).unlink(), 6, "EACCES", "is missing"),
    "policy emptied": (lambda w: _policy(w).write_text(""), 6, "EACCES", "has no rule"),
    "policy for another label": (
        lambda w: _policy(w).write_text(rule(MODEL, "other_t") + "\n"),
        6, "EACCES", "has no rule",
    ),
    "policy with an invalid rule": (
        lambda w: _policy(w).write_text(rule(MODEL) + "\nallow coder_t model:openai use\n"),
        6, "EACCES", "an invalid policy grants nothing",
    ),
    "policy with CRLF line ends": (
        lambda w: _policy(w).write_text(rule(MODEL) + "\r\n"),
        6, "EACCES", "carriage return",
    ),
    "policy with a non-ASCII rule line": (
        lambda w: _policy(w).write_bytes(rule(MODEL).encode() + b"\n\xff\n"),
        6, "EACCES", "ASCII",
    ),
    "policy a symbolic link": (lambda w: _replace_with_link(_policy(w)), 6, "EACCES", "link"),
    "policy a directory": (
        lambda w: _replace_with_directory(_policy(w)), 6, "EACCES", "not a regular file",
    ),
    "policy group-writable": (
        lambda w: _policy(w).chmod(0o664), 6, "EACCES", "writable by its group or by others",
    ),
    "policy owned by the agent's uid": (
        lambda w: os.chown(_policy(w), NOBODY, 0), 6, "EACCES", "the agent's own",
    ),
    "policy owned by another uid": (
        lambda w: os.chown(_policy(w), 12345, 0), 6, "EACCES", "belongs to uid 12345",
    ),
    "policy over 16 MiB": (lambda w: _oversize(_policy(w)), 6, "EFBIG", str(POLICY_LIMIT)),
    "control directory a symbolic link": (
        lambda w: _replace_with_link(_policy(w).parent), 6, "EACCES", "link",
    ),
    "control directory world-writable": (
        lambda w: _policy(w).parent.chmod(0o777), 6, "EACCES", "mode 0777",
    ),
    "provider directory group-writable": (
        lambda w: (w.root / "model" / "openai").chmod(0o775), 6, "EACCES", "mode 0775",
    ),
    "model entry removed": (
        lambda w: (w.root / "model" / MODEL).unlink(), 2, "ENOENT", "does not exist",
    ),
    "model entry a symbolic link": (
        lambda w: _replace_with_link(w.root / "model" / MODEL), 2, "EACCES", "symbolic link",
    ),
    "model entry unreadable to the agent": (
        lambda w: (w.root / "model" / MODEL).chmod(0o600), 2, "EACCES", "needs r--",
    ),
    "provider a symbolic link": (
        lambda w: _replace_with_link(w.root / "model" / "openai"), 2, "EACCES", "symbolic link",
    ),
    "provider unsearchable to the agent": (
        lambda w: (w.root / "model" / "openai").chmod(0o700), 2, "EACCES", "search (x)",
    ),
    "provider removed": (_remove_provider, 2, "ENOENT", "does not exist"),
}  # fmt: skip


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_model_damaged_after_the_agent_was_made_is_denied_and_unlisted(
    world: World, damage: str
) -> None:
    """P-5 (the first denial decides and names its step; every step fails closed), P-4
    (ENOENT for a missing object), S-3/ctx.model.md (the model's policy is host-owned: one
    the agent, or any uid but the host, could rewrite denies at step 6), F-1/T-5 (the view
    lists only what passes the chain): coder may use ``openai/gpt-5.6`` and sees it, next
    to ``local/llama-3.1-8b``; after the damage ``explain`` denies at the step that the
    damage concerns, with its errno and a reason naming it, and the view no longer lists
    the damaged model (nor ``openai``, which has no other), while the other model stays
    listed (both are listed undamaged: see the test of harmless changes below)."""
    world.made([MODEL, "local/llama-3.1-8b"])
    world.add_model(MODEL)
    world.add_model("local/llama-3.1-8b")
    assert decision(world.explain(MODEL))["allowed"]
    harm, step, code, fragment = DAMAGES[damage]
    harm(world)
    got_step, got_code, reason = denial(world.explain(MODEL))
    assert (got_step, got_code) == (step, code), reason
    assert fragment in reason, reason
    assert world.shown() == {"local": ["llama-3.1-8b", "llama-3.1-8b.d"]}


HARMLESS = {
    # Root reads a host-owned policy whatever its mode: the host's file, not the agent's.
    "policy mode 0000": lambda w: _policy(w).chmod(0o000),
    # "a file or a directory" (ctx.model.md): a directory the agent may list and enter.
    "model entry a directory": lambda w: (
        (w.root / "model" / MODEL).unlink(),
        (w.root / "model" / MODEL).mkdir(mode=0o755),
    ),
    # A sticky, host-owned directory: nobody else may rename or remove the host's policy.
    "control directory sticky 1777": lambda w: _policy(w).parent.chmod(0o1777),
    # Entries that are no legal model in the provider's directory are never listed.
    "odd names beside the model": lambda w: [
        (w.root / "model" / "openai").joinpath(name).write_text("")
        for name in (".hidden", "-x", "a b", "z" * 255, "gpt-5.7.d")
    ],
}


@pytest.mark.parametrize("change", sorted(HARMLESS))
def test_a_change_that_leaves_the_model_host_owned_keeps_it_usable_and_listed(
    world: World, change: str
) -> None:
    """P-5 steps 2 and 6 read as docs/policy.md gives them: a host-owned policy of mode
    0000 (read by the host), a model entry that is a directory, a sticky control directory
    and stray entries beside the model leave ``openai/gpt-5.6`` allowed and listed, beside
    ``local/llama-3.1-8b`` (the starting point of the damage tests above)."""
    world.made([MODEL, "local/llama-3.1-8b"])
    world.add_model(MODEL)
    world.add_model("local/llama-3.1-8b")
    HARMLESS[change](world)
    assert decision(world.explain(MODEL))["allowed"]
    assert world.shown() == {
        "local": ["llama-3.1-8b", "llama-3.1-8b.d"],
        "openai": ["gpt-5.6", "gpt-5.6.d"],
    }


# ----------------------------------------------------- F-1, T-5: the mount and the tools


@needs_fuse_as_root
def test_the_mounted_view_lists_models_as_the_chain_decides_and_follows_changes(
    world: World,
) -> None:
    """F-1 (only objects that pass the effective authority check are listed; a policy change
    shows within a second, docs/mount.md), R-2 (models are the host's): coder may use
    ``openai/ok`` and ``local/llama-3.1-8b``; ``openai/bad``'s policy is a link and
    ``other/m`` is not granted.  ``ctx mount --as coder`` lists exactly the usable models
    and their control directories, names beside them with bytes that are not UTF-8 do not
    disturb it, the usable model's policy reads through the view, nothing can be made under
    ``model/``, and removing and restoring ``ok``'s policy hides and shows it again.  The
    host's own mount lists every model."""
    world.made(["openai/ok", "openai/bad", "local/llama-3.1-8b"])
    world.add_model("openai/ok", rule("openai/ok") + "\n")
    world.add_model("openai/bad", rule("openai/bad") + "\n")
    _replace_with_link(world.root / "model" / "openai" / "bad.d" / "policy")
    world.add_model("local/llama-3.1-8b")
    world.add_model("other/m", rule("other/m") + "\n")
    stray = os.fsencode(world.root / "model" / "openai") + b"/\xff\xfe"
    with open(stray, "wb"):
        pass

    view = world.top / "view"
    view.mkdir()
    with serving(world.root, view, "--as", AGENT) as mount:
        assert sorted(os.listdir(view / "model")) == ["local", "openai"], mount.said()
        assert sorted(os.listdir(view / "model" / "openai")) == ["ok", "ok.d"]
        assert sorted(os.listdir(view / "model" / "local")) == ["llama-3.1-8b", "llama-3.1-8b.d"]
        for hidden in ("other", "openai/bad", "openai/bad.d"):
            with pytest.raises(FileNotFoundError):
                os.stat(view / "model" / hidden)
        assert (view / "model" / "openai" / "ok.d" / "policy").read_text() == (
            rule("openai/ok") + "\n"
        )
        for made in (view / "model" / "openai" / "new", view / "model" / "new"):
            with pytest.raises(OSError) as refused:
                made.write_text("")
            assert refused.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS), made
            assert not Path(str(made).replace(str(view), str(world.root))).exists()

        own = world.root / "model" / "openai" / "ok.d" / "policy"
        os.rename(own, own.with_name("policy.away"))
        assert wait_for(lambda: not (view / "model" / "openai").exists(), 10)
        assert os.listdir(view / "model") == ["local"]
        os.rename(own.with_name("policy.away"), own)
        assert wait_for(lambda: (view / "model" / "openai" / "ok").exists(), 10)
        assert "Traceback" not in mount.said(), mount.said()

    host = world.top / "host"
    host.mkdir()
    with serving(world.root, host):
        assert sorted(os.listdir(host / "model")) == ["local", "openai", "other"]
        assert {"ok", "bad", "bad.d"} <= set(os.listdir(host / "model" / "openai"))


def test_the_agents_tools_see_the_models_its_view_shows(world: World) -> None:
    """T-5 (a tool reaches under ``/ctx`` what the agent's view shows, no more), F-1:
    ``fs.list /ctx/model/openai`` run as coder lists the model it may use and its control
    directory, not the model whose own policy lacks coder's rule; ``fs.read`` of the usable
    model's policy works, and of the other's is refused."""
    world.made([MODEL, "openai/gpt-5.7"], tools=["fs.list", "fs.read"])
    for tool in ("fs.list", "fs.read"):
        with open(world.root / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:{tool} execute\n")
    world.add_model(MODEL)
    world.add_model("openai/gpt-5.7", "# not granted\n")

    def native(tool: str, payload: dict) -> dict:
        ran = world.ctx("run", "--agent", AGENT, "--native", tool, input=json.dumps(payload))
        assert TRACEBACK not in ran.err, ran
        return json.loads(ran.lines()[-1])

    listed = native("fs.list", {"path": "/ctx/model/openai"})
    assert listed["status"] == "ok", listed
    assert [e["name"] for e in listed["output"]["entries"]] == ["gpt-5.6", "gpt-5.6.d"]
    read = native("fs.read", {"path": "/ctx/model/openai/gpt-5.6.d/policy"})
    assert read["status"] == "ok" and rule(MODEL) in json.dumps(read["output"]), read
    hidden = native("fs.read", {"path": "/ctx/model/openai/gpt-5.7.d/policy"})
    assert hidden["status"] != "ok", hidden


def test_an_agent_granted_more_models_than_a_tool_environment_holds_is_told_so(
    world: World,
) -> None:
    """T-5 (each usable model and its control directory are names in the tools'
    ``CTX_MOUNTS``), docs/tools.md (an error is a sentence the user can act on): an agent
    that may use 1 100 models of 64-byte names cannot start a tool (the variable exceeds
    the 128 KiB the kernel passes); the refusal must name what made it so, the models the
    agent may use, rather than mounts, writable spaces or tools it barely has."""
    models = [f"p/{'m' * 58}{i:06d}" for i in range(1100)]
    world.made(models, tools=["fs.stat"])
    with open(world.root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:fs.stat execute\n")
    for model in models:
        world.add_model(model)
    ran = world.ctx("run", "--agent", AGENT, "fs.stat", "/ctx")
    assert TRACEBACK not in ran.err, ran
    if ran.rc == 0:
        return  # the tool started after all: nothing to explain
    assert ran.rc == 126 and ran.err.startswith("ctx: E2BIG: "), ran
    assert "model" in ran.err, ran.err


# --------------------------------------------------------------- S-3, R-5: logs, bootstrap


def _model_tree(root: Path) -> dict[str, tuple]:
    found = {}
    for directory, names, files in os.walk(root / "model"):
        for name in names + files:
            path = Path(directory, name)
            status = os.lstat(path)
            body = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path.relative_to(root))] = (status.st_mode, status.st_uid, body)
    return found


def test_no_command_creates_or_writes_a_models_log(world: World) -> None:
    """S-3 (logs live with their object: ``model/<p>/<m>.d/log``; no root ``audit/``) and
    ctx.model.md (*the log is neither created nor written, since no model call happens*):
    creating the agent, explaining and querying model use, showing the agent, a tool call
    and ``ctx bootstrap`` leave no ``log`` in any model's control directory and do not touch
    one the host made; bootstrap leaves every model entry, mode and policy as they were
    (R-5: it never destroys user data), even a provider it would find too loose."""
    world.made([MODEL, "local/llama-3.1-8b"], tools=["fs.stat"])
    world.add_model(MODEL)
    world.add_model("local/llama-3.1-8b")
    kept = world.root / "model" / "local" / "llama-3.1-8b.d" / "log"
    kept.write_text("")
    os.utime(kept, (1_000_000_000, 1_000_000_000))
    (world.root / "model" / "stray").mkdir(mode=0o775)
    before = _model_tree(world.root)

    for model in (MODEL, "local/llama-3.1-8b", "openai/absent"):
        world.explain(model)
    policies = ["--policy", world.root / "agent" / f"{AGENT}.d" / "policy"]
    world.ctx("policy", "query", *policies, LABEL, f"model:{MODEL}", "use")
    world.shown()
    with open(world.root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:fs.stat execute\n")
    ran = world.ctx("run", "--agent", AGENT, "fs.stat", "/ctx/model/openai/gpt-5.6")
    assert ran.rc == 0, ran
    booted = world.ctx("bootstrap")
    assert booted.rc == 0 and TRACEBACK not in booted.err, booted

    assert _model_tree(world.root) == before
    assert os.stat(kept).st_mtime == 1_000_000_000
    assert not (world.root / "model" / "openai" / "gpt-5.6.d" / "log").exists()
    assert sorted(os.listdir(world.root)) == ["agent", "bin", "home", "model", "shared", "tool"]


# ------------------------------------------------------------ a non-root host administrator


@contextlib.contextmanager
def own_root(user: UnprivilegedUser) -> Iterator[Path]:
    """A directory of ``user``'s below the scratch top, removed afterwards."""
    top = new_scratch_dir(SCRATCH, "u")
    os.chown(top, user.uid, user.gid)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_non_root_host_uses_its_own_models_and_an_unreadable_policy_denies(
    unprivileged_user: UnprivilegedUser,
) -> None:
    """R-1 (a non-root user's own storage root), A-3 (its agents run as itself), P-5 step 6
    (a control that cannot be read denies with EACCES): the test user bootstraps a root,
    makes an agent for ``local/llama-3.1-8b`` and the model with its policy: explain allows
    and the view lists it.  When root takes the model's policy away from the user (0600,
    root's), the same commands, still run as the user, deny at step 6 with EACCES and no
    traceback, and the view lists nothing."""
    user = unprivileged_user
    with own_root(user) as top:
        root = top / "storage"
        env = clean_env(CTX_STORAGE=str(root), HOME=str(top))

        def as_user(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
            done = run_as(user, [*CTX_ARGV, *args], env=env, cwd=top, stdin=stdin)
            assert TRACEBACK not in done.stderr, done
            return done

        assert as_user("bootstrap").returncode == 0
        request = {"name": "me", "label": "me_t", "model": ["local/llama-3.1-8b"]}
        made = as_user("agent", "create", "-", "--json", stdin=json.dumps(request))
        assert made.returncode == 0, made
        assert json.loads(made.stdout)["identity"]["uid"] == user.uid
        script = (
            "mkdir -p model/local/llama-3.1-8b.d && : > model/local/llama-3.1-8b && "
            "echo 'allow me_t model:local/llama-3.1-8b use' > model/local/llama-3.1-8b.d/policy"
        )
        assert run_as(user, ["sh", "-c", script], env=env, cwd=root).returncode == 0

        def explained() -> dict:
            done = as_user("policy", "explain", "me", "model:local/llama-3.1-8b", "use", "--json")
            answer = json.loads(done.stdout)
            assert done.returncode == (0 if answer["allowed"] else 1), done
            return answer

        def listed() -> list:
            shown = json.loads(as_user("agent", "show", "me", "--json").stdout)
            return next(m[3] for m in shown["tool_mounts"] if m[1] == "/ctx/model")

        assert explained()["allowed"]
        assert listed() == ["local"]

        policy = root / "model" / "local" / "llama-3.1-8b.d" / "policy"
        os.chown(policy, 0, 0)
        policy.chmod(0o600)
        answer = explained()
        assert (answer["step"], answer["errno"]) == (6, "EACCES"), answer
        assert "llama-3.1-8b.d/policy" in answer["reason"], answer
        assert listed() == []

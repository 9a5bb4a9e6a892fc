"""Polar's runner inside the verify sandbox (polar/scoring/observer.py starts it; stdlib and pytest only, never
imported by the host). It connects to the parent's socket and receives a nonce **before** anything of the
workspace can run, then:

  pytest SOCKET INI -- FILE...   pytest.main with a fixed configuration and this module's plugin registered
                                 first; one record per test outcome, per failed collection, and the session's end
  python SOCKET EVALDIR TARGET SUMMARY
                                 a task's python evaluator, imported from EVALDIR (the workspace off sys.path),
                                 called on the workspace (the cwd); its reward as a record

Records are lines `NONCE SEQ KIND FIELD...` (tab-separated, each field `ascii()` of a str), written with the
os.write and fd captured at start: the exit status never carries a result. The plugin snapshots pytest's
report classes, runner functions, hook callers and itself before any workspace code runs and checks them
before each report and at the end; any change is a `tampered` record, which scores 0.
"""
import os
import socket
import sys

_write, _ascii, _pid = os.write, ascii, os.getpid  # captured before any workspace code could replace them
GUARD = "polar_guard.py"  # observe_guard.py, copied beside this file


def connect(path):
    """The fd to the parent (a dup, so closing the socket object elsewhere does not close it) and its nonce."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    here = os.getcwd()
    os.chdir(os.path.dirname(path))  # by its name in its folder: the full path may pass AF_UNIX's 108 bytes
    try:
        s.connect(os.path.basename(path))
    finally:
        os.chdir(here)
    nonce = b""
    while len(nonce) < 32:
        chunk = s.recv(32 - len(nonce))
        if not chunk:
            raise SystemExit("polar observer: the parent closed the channel")
        nonce += chunk
    fd = os.dup(s.fileno())
    s.close()
    return fd, nonce.decode("ascii")


def sender(fd, nonce):
    """send(kind, *fields): one record; closed over the captured writer, the fd, the nonce and a counter."""
    seq = [0]

    def send(kind, *fields):
        seq[0] += 1
        line = "\t".join([nonce, str(seq[0]), kind, *[_ascii(str(f)) for f in fields]]) + "\n"
        data = line.encode("ascii")
        while data:
            data = data[_write(fd, data):]
    return send


def pytest_objects(pytest):
    """What reports flow through: pytest's report classes, runner, collectors, outcomes and pluggy's calling."""
    import _pytest.fixtures as fixtures
    import _pytest.main as main
    import _pytest.outcomes as outcomes
    import _pytest.python as python
    import _pytest.reports as reports
    import _pytest.runner as runner
    import _pytest.skipping as skipping
    import pluggy

    found = {"sys.modules[" + m.__name__ + "]": m for m in (fixtures, main, outcomes, python, reports, runner,
                                                             skipping, pluggy)}
    for mod, names in ((runner, ("runtestprotocol", "call_and_report", "call_runtest_hook", "CallInfo",
                                 "pytest_runtest_protocol", "pytest_runtest_call", "pytest_runtest_makereport",
                                 "pytest_runtest_setup", "pytest_runtest_teardown", "check_interactive_exception",
                                 "SetupState")),
                       (reports, ("TestReport", "CollectReport", "BaseReport")),
                       (python, ("Function", "Module", "Class", "pytest_pyfunc_call", "pytest_collect_file")),
                       (main, ("Session", "pytest_runtestloop", "wrap_session")),
                       (skipping, ("pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_makereport")),
                       (outcomes, ("fail", "skip", "exit", "xfail", "Skipped", "Failed", "OutcomeException")),
                       (fixtures, ("FixtureDef", "FixtureRequest"))):
        for name in names:
            if hasattr(mod, name):
                found[mod.__name__ + "." + name] = getattr(mod, name)
    classes = {"TestReport": reports.TestReport, "BaseReport": reports.BaseReport, "CallInfo": runner.CallInfo,
               "Function": python.Function, "FixtureDef": fixtures.FixtureDef, "Session": main.Session,
               "PluginManager": pluggy.PluginManager}
    import pluggy._hooks as hooks

    caller = getattr(hooks, "HookCaller", None) or getattr(hooks, "_HookCaller", None)
    if caller is not None:
        classes["HookCaller"] = caller
    for cname, cls in classes.items():
        for attr, value in vars(cls).items():
            found[cname + "." + attr] = value
    found["pytest.main"] = pytest.main
    return found


SENSITIVE = ("pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_call", "pytest_runtest_logreport",
             "pytest_pyfunc_call", "pytest_report_teststatus", "pytest_collectreport", "pytest_runtest_logfinish",
             "pytest_sessionfinish")


def make_watch(pytest, conftests, checks):
    """(intact, hook_impls, state): the checks, over what pytest's machinery and the comparison checks were when
    this ran (before any workspace code). Their state lives in this closure, not in attributes a workspace module
    could reach by name."""
    known = {**pytest_objects(pytest), **checks_state(checks)}
    state = {"broken": None, "impls": None, "config": None, "cls": None, "plugin": None, "own": {}}

    def hook_impls():
        hook = state["config"].hook
        return {name: [(i.plugin, i.function) for i in getattr(hook, name).get_hookimpls()]
                for name in SENSITIVE if hasattr(hook, name)}

    def new_impls():
        """A sensitive hook implemented by a plugin that came after collection started and is not one of the
        task's conftest files (a workspace module registering itself, say)."""
        out = []
        for name, impls in hook_impls().items():
            for plugin, function in impls:
                if (plugin, function) in state["impls"].get(name, ()):
                    continue
                path = getattr(plugin, "__file__", None) or ""
                if not (os.path.basename(path) == "conftest.py" and os.path.realpath(path) in conftests):
                    out.append(name + " by " + str(getattr(plugin, "__name__", type(plugin).__name__)))
        return out

    def intact():
        """None, or what changed since the start (remembered: once broken, always broken)."""
        if state["broken"] is None:
            now = pytest_objects(sys.modules["pytest"]) if "pytest" in sys.modules else {}
            now.update(checks_state(checks))
            changed = [k for k, v in known.items() if now.get(k) is not v]
            changed += [k for k, v in state["own"].items() if vars(state["cls"]).get(k) is not v]
            changed += [k for k in vars(state["plugin"]) if k in state["own"]]
            if state["impls"] is not None:
                changed += new_impls()
            if changed:
                state["broken"] = "pytest internals changed during the run: " + ", ".join(sorted(changed)[:20])
        return state["broken"]
    return intact, hook_impls, state


def checks_state(checks):
    """What the comparison checks are made of (observe_guard.py): the builtins that name them, their functions'
    code, their instance and class, and the globals of their module, each by identity."""
    import builtins

    found = {}
    for name, check in checks.items():
        func, owner = check.__func__, check.__self__
        found["builtins." + name] = vars(builtins).get(name)
        found[name + ".__func__"] = func
        found[name + ".__code__"] = func.__code__
        found[name + ".__self__"] = owner
        for key, value in [*vars(owner).items(), *vars(type(owner)).items(), *func.__globals__.items()]:
            found["guard." + key] = value
    return found


def outcome_of(phases):
    """One test's outcome from its (when, outcome) reports: passed only when its call passed and nothing failed."""
    outcomes = [o for _when, o in phases]
    if "failed" in outcomes:
        return "failed"
    if ("call", "passed") in phases and all(o == "passed" for o in outcomes):
        return "passed"
    return "skipped" if "skipped" in outcomes or "xfail" in outcomes else "incomplete"


def make_observer(pytest, send, conftests, marker, checks):
    """The plugin, registered first (before pytest reads any conftest or test file); `checks`: the comparison
    checks installed as builtins (observe_guard.py), watched like pytest's internals."""
    intact, hook_impls, state = make_watch(pytest, conftests, checks)
    phases = {}

    class Observer:
        def pytest_configure(self, config):
            state["config"] = config

        def pytest_collection(self, session):
            state["impls"] = hook_impls()

        def pytest_collectreport(self, report):
            if report.failed:
                send("collect-error", report.nodeid)

        def pytest_runtest_logreport(self, report):
            outcome = "xfail" if getattr(report, "wasxfail", None) is not None else report.outcome
            phases.setdefault(report.nodeid, []).append((report.when, outcome))
            text = report.longreprtext if report.failed else ""
            if marker in text:  # a workspace class's comparison decided an equality check (observe_guard.py)
                send("comparison", report.nodeid, text[text.index(marker):].splitlines()[0][:300])

        def pytest_runtest_logfinish(self, nodeid, location):
            seen = phases.pop(nodeid, [])
            broken = intact()
            if broken:
                send("tampered", broken)
            else:
                send("test", nodeid, outcome_of(seen))

        def pytest_sessionfinish(self, session, exitstatus):
            broken = intact()
            if broken:
                send("tampered", broken)
            send("end", int(exitstatus), session.testscollected)

    observer = Observer()
    state.update(cls=Observer, plugin=observer, own=dict(vars(Observer)))
    return observer


def conftest_files(root):
    found = set()
    for dirpath, _dirs, files in os.walk(root):
        if "conftest.py" in files:
            found.add(os.path.realpath(os.path.join(dirpath, "conftest.py")))
    return found


def run_pytest(send, guard, trusted, ini, files, rootdir=None):
    """pytest on the task's files: the task's ini (or Polar's empty one), the workspace (cwd) as rootdir and
    conftest boundary (a Harbor task's: its read-only /tests), importlib imports, no cache; test folders, then
    the workspace, at the END of sys.path (the standard library and pytest come first, whatever the workspace
    names its modules)."""
    try:  # before the workspace is on sys.path: pytest is the image's, whatever the workspace holds
        import pytest
    except ImportError as e:
        send("no-pytest", str(e))
        return 3
    workspace = os.getcwd()
    rootdir = rootdir or workspace
    for d in [*sorted({os.path.dirname(os.path.join(workspace, f)) for f in files}), workspace]:
        if d not in sys.path:
            sys.path.append(d)

    conftests = conftest_files(rootdir)
    guard.patch_pytest_rewrite({os.path.realpath(os.path.join(workspace, f)) for f in files})
    checks = guard.Comparisons(trusted).install()
    plugin = make_observer(pytest, send, conftests, guard.MARKER, checks)
    args = ["-c", ini, "--rootdir", rootdir, "--confcutdir", rootdir, "-p", "no:cacheprovider",
            "--import-mode=importlib", "-q", "-rfE", "--", *files]
    code = pytest.main(args, plugins=[plugin])
    return int(code)


def run_python(send, evaldir, target, summary_file):
    """A task's python evaluator: `module:function(workspace: Path, summary: dict)`, imported from evaldir."""
    import json
    import math
    import traceback
    from pathlib import Path

    sys.path.insert(0, evaldir)
    module, _, name = target.partition(":")
    try:
        func = getattr(__import__("importlib").import_module(module), name)
    except (ImportError, AttributeError) as e:
        send("import-error", type(e).__name__ + ": " + str(e))
        return 3
    send("imported")
    with open(summary_file) as f:
        summary = json.load(f)
    try:
        value = func(Path(os.getcwd()), summary)
    except Exception:  # noqa: BLE001 - the verifier met something in the workspace it could not take
        send("raised", traceback.format_exc()[-4000:])
        return 4
    reward, output = (value.get("reward"), str(value.get("output", ""))) if isinstance(value, dict) else (value, "")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        send("no-number", repr(value)[:1000])
        return 5
    send("result", repr(float(reward)), output[-20000:])
    return 0 if math.isfinite(reward) else 5


def load_guard():
    """observe_guard.py from this file's folder (Polar's, fresh for this run), kept out of sys.modules."""
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    spec = importlib.util.spec_from_file_location("polar_observe_guard", os.path.join(here, GUARD))
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    return guard, here


def owned_files(here, files, rootdir):
    """The task's own files, whose comparisons and introspection are trusted: the test files named, a Harbor
    task's whole /tests (its rootdir), and the files the task staged (owned.txt beside this file)."""
    listed = os.path.join(here, "owned.txt")
    owned = [os.path.join(os.getcwd(), f) for f in files]
    if os.path.isfile(listed):
        with open(listed) as f:
            owned += [os.path.join(os.getcwd(), line.rstrip("\n")) for line in f if line.strip()]
    return owned, ([os.path.realpath(rootdir) + os.sep] if rootdir else [])


def main(argv):
    mode, path = argv[0], argv[1]
    fd, nonce = connect(path)
    send = sender(fd, nonce)
    send("start", _pid())
    guard, here = load_guard()
    if mode == "pytest":  # pytest SOCKET INI [ROOTDIR] -- FILE...
        ini, files, rest = argv[2], argv[argv.index("--") + 1:], argv[3:argv.index("--")]
        rootdir = rest[0] if rest else None
        owned, roots = owned_files(here, files, rootdir)
    else:  # python SOCKET EVALDIR TARGET SUMMARY: the task's evaluator package is its own
        owned, roots = [], [os.path.realpath(argv[2]) + os.sep]
    base, owned_set = guard.trusted_roots(owned)
    trusted = guard.make_trust(base + tuple(roots), owned_set)
    guard.install_audit_guard(lambda what: send("guard", what), trusted)  # before any workspace code
    if mode == "pytest":
        return run_pytest(send, guard, trusted, ini, files, rootdir)
    return run_python(send, *argv[2:5])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Guards of Polar's runner inside the verify sandbox (polar/scoring/observe_child.py loads this file from its own
folder before any workspace code runs; stdlib only, never imported by the host).

- `install_audit_guard`: a Python audit hook (permanent: nothing can remove it) that stops and reports the
  generic ways into the runner's state when workspace code takes them: gc object and referrer walks, frames
  (sys._getframe, tracebacks' and generators' frames, inspect's and traceback's walkers), trace and profile
  hooks, ctypes, /proc's memory and descriptor files, code objects made or compiled under a trusted file's name.
  Who asked is the first frame outside those walkers: trusted code (the standard library, the image's packages,
  Polar's runner, the task's own test files) may; anything else is the workspace's.
- Strict comparison: `rewrite(tree)` turns the equality checks of the task's test files (`==`, `!=`, `in`,
  `not in`, unittest's assertEqual family) into calls of `Comparisons`' checks. A check between a value of the
  built-in types and one whose comparison a workspace class defines (an `int` subclass, an object equal to
  anything, either inside a list) is decided by the built-in types' own comparison; where the workspace's method
  said otherwise, the test fails with the marker `polar-comparison:`, which the runner reports.
"""
import ast
import builtins
import os
import sys

MARKER = "polar-comparison:"
PLAIN = (int, float, complex, str, bytes, bytearray, bool, type(None), list, tuple, dict, set, frozenset, range)
SCAN_LIMIT = 10000  # elements of a container looked at for a workspace value, at most
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}  # the attributes that hand out a frame
WATCHED = {"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
           "sys.settrace", "sys.setprofile", "code.__new__", "object.__getattr__", "compile", "open",
           "os.listdir", "os.scandir"}
WALKERS = ("/inspect.py", "/ctypes/__init__.py", "/ctypes/_aix.py")  # hand frames or memory to their caller
TB_WALKERS = ("walk_tb", "walk_stack")  # traceback's generators that yield frames to whoever iterates them


def trusted_roots(owned):
    """Realpaths of what may use introspection and define comparisons: sys.path as the runner found it (the
    standard library, the image's packages; -I keeps the workspace and the user site off it), the runner's folder
    and the task's own files (`owned`)."""
    roots = [os.path.realpath(p) + os.sep for p in sys.path if p and os.path.isdir(p)]
    roots.append(os.path.dirname(os.path.realpath(__file__)) + os.sep)
    return tuple(roots), frozenset(os.path.realpath(p) for p in owned)


def make_trust(roots, owned):
    def trusted_file(name):
        if name.startswith("<frozen "):
            return True
        real = os.path.realpath(name)
        return real in owned or real.startswith(roots)
    return trusted_file


def install_audit_guard(report, trusted_file):
    """`report(what)` for each attempt, which then raises (stopped)."""
    busy = [False]
    getframe = sys._getframe

    def asker():
        """The frame that asked: past inspect's and ctypes' own frames, and traceback's frame walkers."""
        frame = getframe(3)  # 0: this, 1: judged, 2: the hook, 3: who raised the event
        while frame is not None and (frame.f_code.co_filename.endswith(WALKERS) or (
                frame.f_code.co_filename.endswith("/traceback.py") and frame.f_code.co_name in TB_WALKERS)):
            frame = frame.f_back
        return frame

    def judged(event, args):
        """None: allowed; else what the workspace tried, from where."""
        if event == "object.__getattr__" and args[1] not in FRAME_ATTRS:
            return None
        if event in ("open", "os.listdir", "os.scandir") and not _proc_path(args[0]):
            return None
        if event == "compile" and not (isinstance(args[1], str) and not args[1].startswith("<")
                                       and trusted_file(args[1])):
            return None  # only code compiled under a trusted file's name could pass for trusted code
        frame = asker()
        if frame is None or trusted_file(frame.f_code.co_filename):
            return None
        detail = f"({args[1]})" if event == "object.__getattr__" else ""
        return f"{event}{detail} from {frame.f_code.co_filename}:{frame.f_lineno}"

    def hook(event, args):
        if busy[0] or not (event in WATCHED or event.startswith("ctypes.")):
            return
        busy[0] = True
        try:
            what = judged(event, args)
        finally:
            busy[0] = False
        if what is not None:
            report(what)
            raise RuntimeError(f"polar: {event} is not allowed to the code under test during verification")
    sys.addaudithook(hook)


def _proc_path(path):
    if not isinstance(path, (str, bytes)):
        return False
    path = os.fsdecode(path)
    if not path.startswith("/proc/"):
        return False
    parts = path.split("/")
    return len(parts) > 3 and parts[3] in ("mem", "fd", "fdinfo", "environ", "maps", "pagemap", "task")


class Comparisons:
    """The checks the rewritten test files call, as builtins (`__polar_eq__` …); `trusted_file` tells a workspace
    class's comparison method from the standard library's, the image's and the task's."""

    def __init__(self, trusted_file):
        self.trusted_file = trusted_file

    def install(self):
        names = {"__polar_eq__": self.eq, "__polar_ne__": self.ne, "__polar_in__": self.contains,
                 "__polar_not_in__": self.not_contains, "__polar_pair__": self.pair, "__polar_chain__": self.chain}
        for name, check in names.items():
            setattr(builtins, name, check)
        return names

    # -- what the tests call --------------------------------------------------------------------------------------
    def eq(self, a, b):
        result = a == b
        self._check(a, b, bool(result) if isinstance(result, bool) else None, "==")
        return result

    def ne(self, a, b):
        result = a != b
        self._check(a, b, (not result) if isinstance(result, bool) else None, "!=")
        return result

    def contains(self, a, b):
        result = a in b
        if isinstance(b, PLAIN) and not isinstance(b, (str, bytes, bytearray, range)) and self._mixed_in(a, b):
            strict = any(self.strict_eq(a, x) for x in (b if not isinstance(b, dict) else b.keys()))
            if strict != result:
                self._fail(a, b, "in")
        return result

    def not_contains(self, a, b):
        return not self.contains(a, b)

    def pair(self, name, a, b):
        self._check(a, b, None, name)
        return a, b

    def chain(self, left, *rest):
        """`a == b < c`: each link in turn, lazily, as Python does."""
        import operator
        ops = {"==": self.eq, "!=": self.ne, "in": self.contains, "not in": self.not_contains, "<": operator.lt,
               "<=": operator.le, ">": operator.gt, ">=": operator.ge, "is": operator.is_,
               "is not": operator.is_not}
        result = True
        for op, thunk in rest:
            right = thunk()
            result = ops[op](left, right)
            if not result:
                return result
            left = right
        return result

    # -- the rule -------------------------------------------------------------------------------------------------
    def _check(self, a, b, said, op):
        """When one side is plain built-in data and the other holds a workspace comparison, the built-in types'
        own comparison decides; a workspace method that said otherwise fails the test."""
        if not ((self._plain(a) and self._holds_workspace(b)) or (self._plain(b) and self._holds_workspace(a))):
            return
        if said is None:
            try:
                said = bool(a == b)
            except Exception:  # noqa: BLE001 - the workspace's method raised: not the built-in answer
                said = not self.strict_eq(a, b)
        if said != self.strict_eq(a, b):
            self._fail(a, b, op)

    def _fail(self, a, b, op):
        side = a if self._holds_workspace(a) else b
        raise AssertionError(f"{MARKER} {op} between {type(a).__name__} and {type(b).__name__} was decided by "
                             f"{self._owner(side)} (a workspace class's comparison): it fails")

    def _owner(self, value):
        for v in _walk(value):
            cls = self._workspace_class(type(v))
            if cls is not None:
                return f"{cls.__module__}.{cls.__qualname__}"
        return type(value).__name__

    def _plain(self, value):
        return all(type(v) in PLAIN for v in _walk(value))

    def _holds_workspace(self, value):
        return any(self._workspace_class(type(v)) is not None for v in _walk(value))

    def _mixed_in(self, a, b):
        return (self._plain(a) and self._holds_workspace(b)) or (self._plain(b) and self._holds_workspace(a))

    def _workspace_class(self, cls):
        """The class whose `__eq__` decides for `cls`, when that is the workspace's; None otherwise."""
        for klass in cls.__mro__:
            for name in ("__eq__", "__ne__"):
                if name in vars(klass):
                    if not self._trusted_method(klass, vars(klass)[name]):
                        return klass
            if "__eq__" in vars(klass):
                return None
        return None

    def _trusted_method(self, klass, method):
        if not klass.__flags__ & (1 << 9):  # not a heap type: a C type's own comparison
            return True
        code = getattr(method, "__code__", None)
        if type(method).__name__ == "function" and code is not None:
            return self.trusted_file(code.co_filename)
        module = sys.modules.get(klass.__module__)
        return type(method).__name__ == "wrapper_descriptor" or bool(
            module is not None and getattr(module, "__file__", None) and self.trusted_file(module.__file__))

    def strict_eq(self, a, b):
        """Equality by the built-in types' comparison: containers element by element, a workspace value by the
        nearest class of its own that does not define a workspace comparison, else identity."""
        if type(a) in (list, tuple) and type(b) in (list, tuple):
            return type(a) is type(b) and len(a) == len(b) and all(self.strict_eq(x, y) for x, y in zip(a, b))
        if type(a) is dict and type(b) is dict:
            return len(a) == len(b) and all(
                any(self.strict_eq(k, k2) and self.strict_eq(v, b[k2]) for k2 in b) for k, v in a.items())
        if type(a) in (set, frozenset) and type(b) in (set, frozenset):
            return len(a) == len(b) and all(any(self.strict_eq(x, y) for y in b) for x in a)
        for x, y in ((a, b), (b, a)):
            method = self._builtin_eq(type(x))
            if method is not None:
                result = method(x, y)
                if result is not NotImplemented:
                    return bool(result)
        return a is b

    def _builtin_eq(self, cls):
        for klass in cls.__mro__:
            if "__eq__" in vars(klass) and self._trusted_method(klass, vars(klass)["__eq__"]):
                return vars(klass)["__eq__"]
        return None


def _walk(value, limit=SCAN_LIMIT):
    """The value and what its plain containers hold, breadth first, at most `limit` of them."""
    queue, seen = [value], 0
    while queue and seen < limit:
        v = queue.pop()
        seen += 1
        yield v
        if type(v) in (list, tuple, set, frozenset):
            queue.extend(v)
        elif type(v) is dict:
            queue.extend(v.keys())
            queue.extend(v.values())


# -- the rewrite of the task's test files ---------------------------------------------------------------------------
PAIR_ASSERTS = frozenset({"assertEqual", "assertEquals", "assertNotEqual", "assertListEqual", "assertTupleEqual",
                          "assertDictEqual", "assertSetEqual", "assertSequenceEqual", "assertCountEqual",
                          "assertMultiLineEqual", "assertAlmostEqual", "assertNotAlmostEqual"})
OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
       ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not"}
SINGLE = {ast.Eq: "__polar_eq__", ast.NotEq: "__polar_ne__", ast.In: "__polar_in__", ast.NotIn: "__polar_not_in__"}


class _Rewrite(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        if not any(type(op) in SINGLE for op in node.ops):
            return node
        if len(node.ops) == 1:
            call = ast.Call(ast.Name(SINGLE[type(node.ops[0])], ast.Load()), [node.left, node.comparators[0]], [])
        else:
            links = [ast.Tuple([ast.Constant(OPS[type(op)]), ast.Lambda(_no_args(), right)], ast.Load())
                     for op, right in zip(node.ops, node.comparators)]
            call = ast.Call(ast.Name("__polar_chain__", ast.Load()), [node.left, *links], [])
        return ast.copy_location(call, node)

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in PAIR_ASSERTS and len(node.args) >= 2 and \
                not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            pair = ast.Call(ast.Name("__polar_pair__", ast.Load()), [ast.Constant(func.attr), *node.args[:2]], [])
            node.args = [ast.Starred(pair, ast.Load()), *node.args[2:]]
        return node


def _no_args():
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                         defaults=[])


def rewrite(tree):
    """The test module's equality checks as calls of the installed checks (in place; returns the tree)."""
    _Rewrite().visit(tree)
    ast.fix_missing_locations(tree)
    return tree


def patch_pytest_rewrite(files):
    """pytest's assertion rewriting (which compiles every test module pytest collects) rewrites the task's test
    files (`files`, realpaths) our way first; the .pyc cache goes to a private folder so no planted one is read."""
    import tempfile

    import _pytest.assertion.rewrite as rewrite_module

    sys.pycache_prefix = tempfile.mkdtemp(prefix="polar-pyc-")
    original = rewrite_module.rewrite_asserts

    def rewrite_asserts(mod, source, module_path=None, config=None):
        if module_path is not None and os.path.realpath(str(module_path)) in files:
            rewrite(mod)
        return original(mod, source, module_path, config)
    rewrite_module.rewrite_asserts = rewrite_asserts

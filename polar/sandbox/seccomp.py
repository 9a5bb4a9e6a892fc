"""The seccomp filter every isolated sandbox runs under (issue 41 item 5): what an agent needs stays, what only
reaches for the kernel or out of the sandbox is refused with EPERM.

Denied (DENIED below): new user namespaces (`unshare`/`clone` with CLONE_NEWUSER; `clone3`, whose flags a filter
cannot read, answers ENOSYS so the C library falls back to `clone`), joining namespaces (`setns`), every mount
call, the kernel keyring, bpf, perf events, userfaultfd, io_uring, kernel modules, kexec, reboot, swap, process
accounting, quotas, raw I/O ports, setting the clock, and file handles (`open_by_handle_at`). Allowed: the rest,
ptrace included (debuggers in a task work; a sandbox holds only the agent's own processes, in its own pid
namespace, under one uid).

Three forms of the one list:
  bwrap      a BPF program (`bpf_program()`, built with the host's libseccomp through ctypes), `--seccomp FD`;
  podman     an OCI profile: the engine's own default (/usr/share/containers/seccomp.json, an allowlist) with
             the denied calls taken out of it and the conditional rules added (`oci_profile`);
  apptainer  the list as an allow-by-default profile, `--security seccomp:FILE` (root only: a rootless
             Apptainer sandbox has no filter and its nested user namespaces stay possible); its loader ignores
             errnoRet, so clone3 is a trace stop there (ENOSYS without a tracer) and ptrace is refused.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CLONE_NEWUSER = 0x10000000
DENIED = ("setns", "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
          "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "reboot",
          "init_module", "finit_module", "delete_module", "swapon", "swapoff", "acct", "quotactl", "iopl", "ioperm",
          "settimeofday", "clock_settime", "open_by_handle_at")
NO_NEW_USER = ("unshare", "clone")  # refused when flags (argument 0 on x86) hold CLONE_NEWUSER
UNREADABLE = ("clone3",)  # flags in a struct: ENOSYS, so glibc falls back to clone
ENGINE_DEFAULT = Path("/usr/share/containers/seccomp.json")

# libseccomp's constants (seccomp.h)
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7


def SCMP_ACT_ERRNO(code: int) -> int:  # noqa: N802 - libseccomp's name
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
    pass


def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise SeccompUnavailable(f"libseccomp not found ({e}): install libseccomp2") from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, *conditions: _ArgCmp) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:  # a call this libseccomp does not know (an older one): nothing to refuse by that name
        return
    array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
    if (rc := lib.seccomp_rule_add_array(ctx, action, nr, len(conditions), array)) < 0:
        raise SeccompUnavailable(f"seccomp rule for {name}: {os.strerror(-rc)}")


@functools.lru_cache(maxsize=1)
def bpf_program() -> bytes:
    """The filter as the kernel loads it (struct sock_filter[]), for the native ABI and the 32-bit ones."""
    lib = _lib()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        for arch in (b"x86", b"x32"):  # 32-bit binaries meet the same rules instead of the kill of a bad arch
            token = lib.seccomp_arch_resolve_name(arch)
            if token:
                lib.seccomp_arch_add(ctx, token)
        for name in DENIED:
            _add(lib, ctx, SCMP_ACT_ERRNO(errno.EPERM), name)
        for name in NO_NEW_USER:
            _add(lib, ctx, SCMP_ACT_ERRNO(errno.EPERM), name, _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_NEWUSER,
                                                                      CLONE_NEWUSER))
        for name in UNREADABLE:
            _add(lib, ctx, SCMP_ACT_ERRNO(errno.ENOSYS), name)
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("polar-seccomp")
    try:
        if (rc := lib.seccomp_export_bpf(ctx, fd)) < 0:
            raise SeccompUnavailable(f"seccomp_export_bpf: {os.strerror(-rc)}")
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def program_fd() -> int:
    """A memory file holding bpf_program(), at offset 0, inheritable (bwrap --seccomp FD); the caller closes it."""
    fd = os.memfd_create("polar-seccomp")
    os.write(fd, bpf_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def oci_profile(base: dict[str, Any] | None = None, apptainer: bool = False) -> dict[str, Any]:
    """An OCI seccomp profile: `base` (an allowlist, the engine's default) without the calls we deny, plus our
    rules; without a base, allow-by-default with our rules. `apptainer`: its loader answers every ERRNO rule
    with EPERM (errnoRet ignored), which breaks threads at clone3: clone3 is a trace stop instead (ENOSYS when no
    tracer is attached, kernel seccomp(2)), and ptrace is refused so no tracer can be."""
    profile = json.loads(json.dumps(base)) if base else {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}
    denied = (*DENIED, "ptrace") if apptainer else DENIED
    taken = set(denied) | set(NO_NEW_USER) | set(UNREADABLE)
    kept = []
    for rule in profile.get("syscalls", []):
        names = [n for n in rule.get("names", [rule.get("name")]) if n and n not in taken]
        if names:
            kept.append({**rule, "names": names})
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    masked = {"index": 0, "value": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}
    kept += [{"names": list(denied), **eperm},
             {"names": list(NO_NEW_USER), **eperm, "args": [{**masked, "valueTwo": CLONE_NEWUSER}]}]
    if base:  # an allowlist: the calls without the flag must be allowed again
        kept.append({"names": list(NO_NEW_USER), "action": "SCMP_ACT_ALLOW", "args": [{**masked, "valueTwo": 0}]})
    kept.append({"names": list(UNREADABLE), "action": "SCMP_ACT_TRACE"} if apptainer else
                {"names": list(UNREADABLE), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    profile["syscalls"] = kept
    return profile


def profile_file(apptainer: bool = False) -> Path:
    """The profile as a file in a folder of our own (0700): podman's `--security-opt seccomp=FILE` (over the
    engine's default allowlist) and Apptainer's `--security seccomp:FILE` (allow by default: its loader refuses
    the default's rules) read it."""
    base = json.loads(ENGINE_DEFAULT.read_text()) if ENGINE_DEFAULT.is_file() and not apptainer else None
    text = json.dumps(oci_profile(base, apptainer), indent=1)
    folder = Path(tempfile.gettempdir()) / f"polar-seccomp-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not folder.is_dir() or folder.is_symlink():
        raise SeccompUnavailable(f"{folder} is not a private folder of ours: remove it")
    path = folder / f"profile-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file() or path.read_text() != text:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path

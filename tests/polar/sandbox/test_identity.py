"""polar/sandbox/identity.py: the host identity of a sandbox, handing its folders over and clearing setuid/setgid
bits without ever following a link the agent left, copies without those bits."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from polar.sandbox.identity import (IdRange, Identity, IdentityError, copy_without_privileges,
                                    drop_privilege_bits, hand_over, sandbox_identity, subordinate_range)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")


def test_identity_is_never_root():
    who = sandbox_identity()
    if os.geteuid() != 0:
        assert who is None  # an unprivileged Polar: the sandbox is the caller
        return
    assert who is not None and who.uid != 0 and who.gid != 0
    assert who.setpriv()[:4] == ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups"]


@root_only
def test_root_without_the_user_refuses():
    with pytest.raises(IdentityError, match="make setup"):
        sandbox_identity("polar-no-such-user")


def test_subordinate_range_is_read_per_user_and_maps_inside_ids(tmp_path):
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("someone:100000:65536\npolar-sandbox:165536:65536\n")
    subgid.write_text("polar-sandbox:300000:70000\n")
    ids = subordinate_range("polar-sandbox", (subuid, subgid))
    assert ids == IdRange(165536, 300000, 65536)
    assert ids.host(Identity(0, 0)) == Identity(165536, 300000)  # root inside
    assert ids.host(Identity(1000, 1000)) == Identity(166536, 301000)
    with pytest.raises(IdentityError, match="outside"):
        ids.host(Identity(65536, 0))
    with pytest.raises(IdentityError, match="make setup"):
        subordinate_range("nobody-here", (subuid, subgid))
    subgid.write_text("polar-sandbox:300000:1000\n")
    with pytest.raises(IdentityError, match="at least 65536"):
        subordinate_range("polar-sandbox", (subuid, subgid))


@root_only
def test_setup_gave_polar_sandbox_a_range_of_its_own():
    """make setup's range: above every host uid in use, not root's."""
    ids = subordinate_range()
    assert ids.uid >= 100000 and ids.gid >= 100000 and ids.count >= 65536


def tree_with_links(tmp_path: Path) -> tuple[Path, Path]:
    """A sample folder holding a file, a sub-folder and links to a host file and a host folder."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host's\n")
    (host / "tool").write_text("#!/bin/sh\n")
    (host / "tool").chmod(0o4755)
    sample = tmp_path / "sample"
    (sample / "sub").mkdir(parents=True)
    (sample / "sub" / "file").write_text("x")
    (sample / "link-to-file").symlink_to(host / "secret")
    (sample / "link-to-dir").symlink_to(host)
    (sample / "sub" / "link-to-tool").symlink_to(host / "tool")
    return host, sample


@root_only
def test_hand_over_never_follows_a_link(tmp_path):
    host, sample = tree_with_links(tmp_path)
    who = Identity(4242, 4243)
    hand_over([sample], who)
    for p in (sample, sample / "sub", sample / "sub" / "file", sample / "link-to-file", sample / "link-to-dir"):
        st = p.lstat()
        assert (st.st_uid, st.st_gid) == (4242, 4243), p
    for p in (host, host / "secret", host / "tool"):
        assert (p.stat().st_uid, p.stat().st_gid) == (0, 0), p  # the links' targets keep their owner


def test_privilege_bits_are_cleared_below_never_through_a_link(tmp_path):
    host, sample = tree_with_links(tmp_path)
    (sample / "sub" / "file").chmod(0o6755)
    (sample / "sub").chmod(0o2775)
    assert drop_privilege_bits([sample]) == 2
    assert stat.S_IMODE((sample / "sub" / "file").stat().st_mode) == 0o755
    assert stat.S_IMODE((sample / "sub").stat().st_mode) == 0o775
    assert stat.S_IMODE((host / "tool").stat().st_mode) == 0o4755  # a link's target is not the sample's


def test_copies_carry_no_setuid_or_setgid(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d").chmod(0o2755)
    (src / "d" / "suid").write_text("x")
    (src / "d" / "suid").chmod(0o4755)
    (src / "link").symlink_to("/bin/sh")
    copy_without_privileges(src, tmp_path / "dst")
    copy_without_privileges(src / "d" / "suid", tmp_path / "one" / "suid")
    assert stat.S_IMODE((tmp_path / "dst" / "d" / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "dst" / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "one" / "suid").stat().st_mode) == 0o755
    assert os.readlink(tmp_path / "dst" / "link") == "/bin/sh"  # a link stays a link

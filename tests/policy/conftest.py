"""Fixtures for the policy tests: a real storage root every user can search, a real non-root
user, and an agent ``coder`` running as that user."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.storage import add_agent, make_root
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

CODER_POLICY = """\
# coder sees the storage root at /ctx, may read files and use one model
allow coder_t mount:ctx read
allow coder_t tool:fs.read execute
allow coder_t model:openai/gpt-5.6 use
"""


@pytest.fixture
def root(traversable_tmp: Path) -> Path:
    return make_root(traversable_tmp)


@pytest.fixture
def user(unprivileged_user: UnprivilegedUser) -> UnprivilegedUser:
    return unprivileged_user


@pytest.fixture
def coder(root: Path, user: UnprivilegedUser) -> Path:
    """Agent ``coder`` (label ``coder_t``) as the test user; returns ``agent/coder.d``."""
    return add_agent(root, "coder", uid=user.uid, gid=user.gid, policy=CODER_POLICY)

"""Fixtures: a bootstrapped storage root, a real unprivileged agent user, a FUSE mount."""

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import unprivileged_user as unprivileged_user
from tests.tools.support import world as world

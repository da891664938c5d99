"""Fixtures: a bootstrapped storage root and a real unprivileged agent user."""

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import unprivileged_user as unprivileged_user
from tests.tools.support import world as world

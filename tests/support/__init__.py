"""Helpers every test suite may use: a real unprivileged user, a real storage root layout."""

"""Errors of the pure protocol core: one subclass per spec rule, so callers can tell them apart."""

from __future__ import annotations


class EngramError(Exception):
    """Base of every error raised by the `engram` package."""


class KeyFormatError(EngramError, ValueError):
    """A key string is neither 64-hex nor the right NIP-19 form (never echoes secrets)."""

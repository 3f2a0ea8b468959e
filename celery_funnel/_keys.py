"""Key names that keep related keys in one Redis Cluster hash slot."""

from __future__ import annotations

__all__ = ["companion_key", "hash_tag"]


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes, if it has a ``{tag}``; else None.

    Redis hashes the text between the first ``{`` and the first ``}`` after it, when
    that text is not empty.
    """
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


def companion_key(key: str, suffix: str) -> str:
    """A key for ``suffix`` data that Redis Cluster stores in ``key``'s slot.

    A key with a hash tag keeps it (``a{x}b`` -> ``a{x}b:suffix``); a key without one is
    hashed whole, which ``{key}:suffix`` reproduces when ``key`` holds no ``}``.
    """
    if hash_tag(key) is not None or "}" in key:
        # With a stray "}" but no tag, no companion can share the slot; such keys
        # only come from callers that bypass the key builder.
        return f"{key}:{suffix}"
    return f"{{{key}}}:{suffix}"

"""twinkle.hookspecs, the contract: one hook per event type, and every hook documents
when it fires and each argument."""

from __future__ import annotations

import inspect

from twinkle import hookspecs
from twinkle.plugins import (
    HOOK_FOR_EVENT,
)


def test_every_event_type_has_exactly_one_hook() -> None:
    import typing

    from blinker import NamedSignal

    from twinkle.events import EVENT_TYPES, SIGNALS

    assert set(HOOK_FOR_EVENT) == set(EVENT_TYPES.values())
    assert len(set(HOOK_FOR_EVENT.values())) == len(HOOK_FOR_EVENT)
    for cls, hook in HOOK_FOR_EVENT.items():
        # derived from the type's definition: the contract must spell that hook, for
        # that type, and the signal carries the type's name
        spec = getattr(hookspecs, hook)
        assert typing.get_type_hints(spec)["event"] is cls, hook
        signal = SIGNALS[cls]
        assert isinstance(signal, NamedSignal), hook
        assert signal.name == f"twinkle.{cls.TYPE}"


def test_every_hookspec_documents_when_it_fires_and_each_argument() -> None:
    specs = [getattr(hookspecs, n) for n in dir(hookspecs) if n.startswith("twinkle_")]
    assert len(specs) >= 14
    for fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert doc, f"{fn.__name__} has no docstring"
        for arg in inspect.signature(fn).parameters:
            assert f":param {arg}:" in doc, f"{fn.__name__} does not document {arg!r}"

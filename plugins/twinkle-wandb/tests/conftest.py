"""Ctrl-C reaches this suite (its tests press it, ``twinkle.testing.press_ctrl_c``) even
when a shell started it as a background job, with SIGINT ignored
(``twinkle.testing.handle_stop_signals``)."""

from twinkle.testing import handle_stop_signals

handle_stop_signals()

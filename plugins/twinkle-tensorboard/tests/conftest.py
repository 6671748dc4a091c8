"""Ctrl-C reaches this suite (its tests press it, ``twinkle.testing.press_ctrl_c``) even
when a shell started it as a background job, with SIGINT ignored."""

from twinkle.testing import handle_ctrl_c

handle_ctrl_c()

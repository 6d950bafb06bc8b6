"""A kernel's messages read within a second of arriving, wherever this repository runs notebooks
(the book build's Sphinx process, through icl_lens_book, and tests/test_chapters.py).

jupyter_client's asyncio channels wait for a message by polling the ZMQ socket once, for the
caller's whole timeout. After a cell that opens ipywidgets (many comm messages on the iopub
channel) that wait sometimes misses the shell channel's execute_reply: the reply is already in the
socket, but the poll only returns when its timeout ends, and nbclient waits out the cell's whole
timeout (300 s in the tests, 600 s in the book build) before it reads it and goes on as if nothing
had happened. Measured on the kernels chapter's explorer cell with a 60 s timeout: 7 of 16 runs
waited 60 s, with every iopub message in by 0.6 s; with the waits cut into slices of at most a
second, 0 of 7. A message that never comes still raises Empty when the caller's timeout ends.
"""

import time
from queue import Empty

SLICE = 1.0   # seconds: the longest a missed wake-up can hold a message back


def sliced(get_msg):
    """``get_msg(channel, timeout)`` as repeated waits of at most SLICE seconds until ``timeout``
    (None: until a message comes)."""

    async def get_msg_in_slices(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE if deadline is None else min(SLICE, max(0.0, deadline - time.monotonic()))
            try:
                return await get_msg(self, timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    get_msg_in_slices.sliced = True
    return get_msg_in_slices


def read_replies_in_slices():
    """Make jupyter_client's asyncio channels (nbclient's) wait in slices; idempotent."""
    from jupyter_client.channels import AsyncZMQSocketChannel

    if not getattr(AsyncZMQSocketChannel.get_msg, "sliced", False):
        AsyncZMQSocketChannel.get_msg = sliced(AsyncZMQSocketChannel.get_msg)

"""A progress bar on stderr, drawn only when stderr is a terminal."""

import sys
import time

WIDTH = 30


class Progress:
    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.label, self.total, self.done, self.drawn_at = "", 0, 0, 0.0

    def phase(self, label, total=0):
        self.label, self.total, self.done = label, total, 0
        self.draw(force=True)

    def advance(self, n):
        self.update(self.done + n)

    def update(self, done):
        self.done = done
        self.draw()

    def draw(self, force=False):
        now = time.monotonic()
        if not self.enabled or (not force and now - self.drawn_at < 0.1):
            return
        self.drawn_at = now
        if self.total:
            filled = int(WIDTH * min(self.done, self.total) / self.total)
            bar = f" [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done:,}/{self.total:,}"
        else:
            bar = " ..."
        self.stream.write(f"\r\033[K{self.label}{bar}")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()

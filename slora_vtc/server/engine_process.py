"""`serve`'s engine in a process of its own (the default; `--no-engine-process`: a thread of the server's).

In one process the event loop (HTTP, SSE, detokenizing) and the engine thread share one GIL: every torch
op of a step lets the loop in, and the step then waits for the GIL to come back, so the loop's work
lengthens every step instead of running beside it (benchmarks/README.md, "Our serve against vLLM"). vLLM
splits its API server from its engine core for the same reason. Here the child process runs the
EngineService of service.py unchanged; the server talks to it over a pipe through `RemoteService`,
which offers the server what EngineService offers it (submit, abort, finish, snapshot, count_rejected,
stop, shutdown, healthy, error, clock).

The pipe carries, to the child: ("submit", key, request), ("abort", key, reason), ("finish", key),
("snapshot", key), ("rejected", client), ("stop", drain_s); to the server: ("ready", clock origin) or
("failed", message) once, then ("events", [(key, event), ...]) once per engine step, ("snapshot", key,
snapshot) and finally ("closed", error). The child ignores SIGINT and SIGTERM (the server relays a stop)
and stops at once, aborting everything, when the server's end of the pipe closes. Should the child die,
every request still open ends with an abort (`ENGINE_GONE`) and the server answers 503 from then on.
"""

import atexit
import logging
import multiprocessing
import os
import signal
import socket
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from itertools import count

from slora_vtc.clock import WallClock
from slora_vtc.errors import UserError
from slora_vtc.request import Request, State
from slora_vtc.server.events import Ended, Subscriber, Tokens
from slora_vtc.server.service import SHUTTING_DOWN, EngineService, ServiceStopped, deliver, dispatch

log = logging.getLogger(__name__)

ENGINE_GONE = "the engine process ended"
START_TIMEOUT_S = 900  # loading a large model on a slow disk


def start_engine_process(build_service, timeout_s: float = START_TIMEOUT_S) -> "RemoteService":
    """Spawn the engine process, which calls build_service() (picklable) for its EngineService; return once its
    model is loaded. A UserError there is raised here, with its message."""
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    process = spawn.Process(target=_child_main, args=(theirs, build_service), name="slora-engine", daemon=True)
    with _sigint_ignored():
        process.start()
    theirs.close()
    if not ours.poll(timeout_s):
        process.kill()
        raise UserError(f"the engine process did not start within {timeout_s:.0f} s")
    try:
        kind, value = ours.recv()
    except EOFError:
        process.join()
        raise UserError(f"the engine process exited at start (exit status {process.exitcode})") from None
    if kind == "failed":
        process.join()
        raise UserError(value)
    return RemoteService(process, ours, WallClock(origin=value))


@contextmanager
def _sigint_ignored():
    """SIGINT ignored while the child is spawned (from the main thread; signals are the main thread's), so that
    it starts ignoring it: a Ctrl-C reaches the terminal's whole process group, and the child's first imports,
    before _child_main, would otherwise end in a KeyboardInterrupt traceback. Python keeps an ignored SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class RemoteService:
    """The server's side: EngineService's interface, over the pipe."""

    def __init__(self, process, conn, clock: WallClock):
        self.process, self.clock = process, clock
        self.error: str | None = None
        self._conn = conn
        self._send_lock = threading.RLock()  # sends come from the loop, handlers' threads and signal handlers
        self._keys = count()
        self._open: dict[int, tuple[Subscriber, Request, list[int]]] = {}  # key -> (sub, request, [tokens sent])
        self._key_of: dict[Request, int] = {}  # the open requests' keys
        self._pending: dict[int, Future] = {}  # snapshot key -> its future
        self._closed = False
        self._stopping = False
        self._reader = threading.Thread(target=self._read, name="slora-engine-pipe", daemon=True)
        # runs before multiprocessing's own exit handler (registered earlier), whose terminate() the child ignores
        atexit.register(self._end_child)

    def start(self) -> None:
        self._reader.start()

    @property
    def engine_pid(self) -> int | None:
        return self.process.pid

    @property
    def healthy(self) -> bool:
        return not self._closed and not self._stopping and self.process.is_alive()

    def submit(self, req: Request, sub: Subscriber) -> None:
        key = next(self._keys)
        with self._send_lock:
            if self._closed:
                raise ServiceStopped(self.error or SHUTTING_DOWN)
            self._open[key], self._key_of[req] = (sub, req, [0]), key
            self._conn.send(("submit", key, req))

    def abort(self, req: Request, reason: str) -> None:
        if (key := self._key_of.get(req)) is not None:
            self._send_quietly(("abort", key, reason))

    def finish(self, req: Request) -> None:
        if (key := self._key_of.get(req)) is not None:
            self._send_quietly(("finish", key))

    def count_rejected(self, client: str) -> None:
        self._send_quietly(("rejected", client))

    def snapshot(self) -> Future:
        future: Future = Future()
        key = next(self._keys)
        with self._send_lock:
            if self._closed:
                future.set_exception(ServiceStopped(self.error or SHUTTING_DOWN))
                return future
            self._pending[key] = future
            self._conn.send(("snapshot", key))
        return future

    def stop(self, drain_s: float) -> None:
        """Safe from a signal handler: the handler may have interrupted a send of this thread, so another thread
        sends the stop once that send is out."""
        self._stopping = True
        threading.Thread(target=self._send_quietly, args=(("stop", drain_s),), daemon=True).start()

    def shutdown(self, drain_s: float = 0.0) -> None:
        if self.process.is_alive():
            self.stop(drain_s)
            if self._reader.ident is not None:  # started: it ends when the child reports it has closed
                self._reader.join()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()

    def _end_child(self) -> None:
        """At the server's exit, whatever came before: the child sees its pipe close and stops, else is killed."""
        if self.process.is_alive():
            try:  # shut the socket down, not just our descriptor: the reader thread may be blocked reading it
                with socket.socket(fileno=os.dup(self._conn.fileno())) as end:
                    end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()

    def _send_quietly(self, message: tuple) -> None:
        with self._send_lock:
            if self._closed:
                return  # every request has ended already
            try:
                self._conn.send(message)
            except OSError:
                pass  # the child is gone: the reader ends what is open

    # -- the reader thread ------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                if message[0] == "events":
                    self._deliver(message[1])
                elif message[0] == "snapshot":
                    future, value = self._pending.pop(message[1]), message[2]
                    future.set_exception(value) if isinstance(value, BaseException) else future.set_result(value)
                elif message[0] == "closed":
                    self.error = message[1]
                    break
        except (EOFError, OSError):
            self.error = self.error or ENGINE_GONE
        finally:
            self._close()

    def _deliver(self, pairs: list) -> None:
        events = []
        for key, event in pairs:
            sub, req, sent = self._open[key]
            if isinstance(event, Tokens):
                sent[0] += len(event.ids)
            elif isinstance(event, Ended):
                del self._open[key], self._key_of[req]
            events.append((sub, event))
        dispatch(events)

    def _close(self) -> None:
        """Nothing more comes from the child: end what is still open (it died) and every pending snapshot."""
        with self._send_lock:
            self._closed = True
            self._conn.close()  # the child, if alive, sees its pipe end and exits
        reason = self.error or ENGINE_GONE
        dispatch(
            [
                (sub, Ended(State.ABORTED, reason, req.prompt_len, sent[0], False))
                for sub, req, sent in self._open.values()
            ]
        )
        self._open.clear()
        self._key_of.clear()
        for future in self._pending.values():
            future.set_exception(ServiceStopped(reason))
        self._pending.clear()


# -- the engine process -------------------------------------------------------------------------
class _PipeOutlet:
    """Stands in for an asyncio loop in the child's Subscribers: EngineService's one delivery per step becomes
    one message on the pipe."""

    def __init__(self, conn, lock: threading.Lock, live: dict[int, Request]):
        self.conn, self.lock, self.live = conn, lock, live

    def call_soon_threadsafe(self, _deliver, items: list) -> None:
        for key, event in items:
            if isinstance(event, Ended):
                self.live.pop(key, None)
        self.send(("events", items))

    def send(self, message: tuple) -> None:
        with self.lock:
            try:
                self.conn.send(message)
            except OSError:
                pass  # the server is gone; the main thread sees the pipe closed and stops the engine


def _child_main(conn, build_service) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when to stop, and tells us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        service: EngineService = build_service()
    except UserError as e:
        conn.send(("failed", str(e)))
        return
    except Exception as e:
        conn.send(("failed", f"the engine could not be built: {type(e).__name__}: {e}"))
        return
    live: dict[int, Request] = {}
    outlet = _PipeOutlet(conn, threading.Lock(), live)
    conn.send(("ready", service.clock.origin))
    service.start()
    watcher = threading.Thread(target=_report_close, args=(service, outlet), daemon=True)
    watcher.start()
    try:
        while True:
            _command(service, outlet, live, conn.recv())
    except (EOFError, OSError):
        service.stop(0.0)  # the server went away: abort everything
    watcher.join()


def _command(service: EngineService, outlet: _PipeOutlet, live: dict[int, Request], message: tuple) -> None:
    kind = message[0]
    try:
        if kind == "submit":
            _, key, req = message
            live[key] = req
            service.submit(req, Subscriber(outlet, key))
        elif kind == "abort" and (req := live.get(message[1])) is not None:
            service.abort(req, message[2])
        elif kind == "finish" and (req := live.get(message[1])) is not None:
            service.finish(req)
        elif kind == "snapshot":
            key = message[1]
            service.snapshot().add_done_callback(lambda done: outlet.send(("snapshot", key, _result(done))))
        elif kind == "rejected":
            service.count_rejected(message[1])
        elif kind == "stop":
            service.stop(message[1])
    except ServiceStopped:
        if kind == "submit":  # the engine thread has stopped: refuse it as EngineService would have
            req.state, req.reason = State.REJECTED, service.error or SHUTTING_DOWN
            outlet.call_soon_threadsafe(deliver, [(key, Ended.of(req))])


def _result(done: Future):
    """A snapshot, or the error taking it raised (the server's future raises it)."""
    return done.exception() or done.result()


def _report_close(service: EngineService, outlet: _PipeOutlet) -> None:
    service.wait()
    outlet.send(("closed", service.error))

"""The HTTP server: an OpenAI-compatible and a native API served by the Rust front end
(``_core.Frontend``) in the process that runs the step loop. ``ferrolm serve`` starts it;
``run_server`` runs it from Python; ``testing.running_server`` starts one in a subprocess."""

from ferrolm.server.args import ServerArgs

__all__ = ["ServerArgs", "run_server"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # the engine and the front end load only when a server is wanted
    if name == "run_server":
        from ferrolm.server.rust_frontend import run_server

        return run_server
    raise AttributeError(f"module 'ferrolm.server' has no attribute {name!r}")

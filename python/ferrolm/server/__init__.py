"""The HTTP server: an OpenAI-compatible and a native API over the engine, which runs in
its own process. ``ferrolm serve`` starts it; ``create_app`` builds the app for tests and
embedding."""

from ferrolm.server.args import ServerArgs

__all__ = ["ServerArgs", "create_app", "run_server"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # FastAPI and uvicorn load only when a server is wanted
    if name == "create_app":
        from ferrolm.server.app import create_app

        return create_app
    if name == "run_server":
        from ferrolm.server.launch import run_server

        return run_server
    raise AttributeError(f"module 'ferrolm.server' has no attribute {name!r}")

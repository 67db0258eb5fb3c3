"""``ferrolm serve``: the Rust HTTP front end (``rust_frontend``) and the step loop, in this
process. Nothing here imports an HTTP framework: the front end is in the extension."""

from __future__ import annotations

from ferrolm.server.args import ServerArgs


def print_try(args: ServerArgs, url: str) -> None:
    """A curl line to try the server with."""
    auth = ' -H "Authorization: Bearer $FERROLM_API_KEY"' if args.api_key else ""
    print(
        f"try:  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
        f"""-d '{{"model": "{args.model_name}", "messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 16}}'""",
        flush=True,
    )


def run_server(args: ServerArgs) -> int:
    from ferrolm.server.rust_frontend import run_rust_server

    return run_rust_server(args)

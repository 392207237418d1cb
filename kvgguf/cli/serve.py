"""`kvgguf serve`: llama-cpp-python's OpenAI-compatible server (its FastAPI app, routes and
settings) with kvgguf's compressed KV cache and compressed, byte-bounded prompt cache.

The server builds `llama_cpp.Llama` itself; `kvgguf.install()` makes that a kvgguf.Llama. Its
prompt-cache classes (`--cache true --cache_type ram|disk --cache_size N`, or
`--prompt-cache ram|disk:DIR|redis://HOST:PORT/DB --prompt-cache-bytes N`) become kvgguf's
compressed ones, whose capacity counts the compressed bytes really held; on Redis, several
servers share one cache. Concurrent requests queue and are answered
one after another (`--interrupt_requests true` restores llama_cpp.server's default, where a new
request ends the running stream). Every other flag (and `--config_file`) means what it means in
`python -m llama_cpp.server`. Adds `GET /kvgguf/memory`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

MEMORY_ROUTE = "/kvgguf/memory"


def _missing_extra(e: ImportError) -> int:
    print(
        f"kvgguf serve needs llama-cpp-python's server packages ({e.name} is missing): pip install 'kvgguf[serve]'",
        file=sys.stderr,
    )
    return 2


def build_parser() -> argparse.ArgumentParser:
    from llama_cpp.server.cli import add_args_from_model
    from llama_cpp.server.settings import Settings

    from .main import _kv_codec

    p = argparse.ArgumentParser(
        prog="kvgguf serve", description=__doc__.splitlines()[0], epilog="All other flags are llama_cpp.server's."
    )
    p.add_argument(
        "model_name",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="model name or GGUF path (default: smollm2-135m; --model works too)",
    )
    p.add_argument(
        "--kv-codec", type=_kv_codec, default="tiered", help="kvgguf cache: 'tiered' or a codec name (default: tiered)"
    )
    p.add_argument(
        "--kv-attention",
        choices=("fused", "expand"),
        default="fused",
        help="how attention reads the compressed rows (default: fused)",
    )
    p.add_argument(
        "--prompt-cache",
        default=None,
        metavar="ram|disk:DIR|redis://HOST:PORT/DB",
        help="a compressed prompt cache in memory, in a folder or on Redis (shared by servers)",
    )
    p.add_argument(
        "--prompt-cache-bytes",
        type=int,
        default=None,
        help="compressed bytes the prompt cache may hold (default: 2 GiB)",
    )
    p.add_argument(
        "--no-context-shift",
        action="store_true",
        help="refuse requests past n_ctx instead of shifting (default: shift, as llama.cpp's server does)",
    )
    p.add_argument("--keep", type=int, default=None, help="tokens a context shift keeps (default: the sinks, 4)")
    p.add_argument("--config_file", default=None, help="llama_cpp.server's JSON or YAML config file")
    add_args_from_model(p, Settings)
    return p


def use_compressed_prompt_caches(disk_dir: Optional[str], redis_url: Optional[str] = None) -> None:
    """llama_cpp.server makes llama_cpp.LlamaRAMCache / LlamaDiskCache(capacity_bytes=...): in
    this process, kvgguf's compressed caches answer to those names (the disk one on Redis when
    redis_url is given)."""
    import llama_cpp

    from ..session.prompt_cache import CompressedDiskCache, CompressedRAMCache
    from ..session.redis_cache import CompressedRedisCache

    def ram(capacity_bytes: int = 2 << 30):
        return CompressedRAMCache(capacity_bytes=capacity_bytes)

    def disk(cache_dir: Optional[str] = None, capacity_bytes: int = 2 << 30):
        if redis_url:
            return CompressedRedisCache(redis_url, capacity_bytes=capacity_bytes)
        return CompressedDiskCache(disk_dir or cache_dir or ".cache/kvgguf_prompts", capacity_bytes=capacity_bytes)

    llama_cpp.LlamaRAMCache = ram
    llama_cpp.LlamaDiskCache = disk


def process_rss_bytes() -> Optional[int]:
    """This process's resident memory (Linux's /proc; None elsewhere): what an operator bounds."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def memory_report(llm) -> dict:
    """What /kvgguf/memory answers for the model being served."""
    mem = llm.kv_memory()
    cache = getattr(llm, "cache", None)
    stock_bytes = mem.n_tokens * mem.values_per_token * 2  # llama.cpp's f16 cache for these tokens
    return {
        "kv_codec": None if llm.kv_config is None else str(llm.kv_config),
        "tokens_in_context": llm.n_tokens,
        "tokens_evaluated": llm.tokens_evaluated,
        "kv_bytes": mem.total_bytes,
        "bits_per_value": None if not mem.n_tokens else round(mem.bits_per_value, 3),
        "f16_bytes_for_these_tokens": stock_bytes,
        "tiers": [{"name": t.name, "codec": t.codec, "bytes": t.bytes} for t in mem.tiers],
        "index_bytes": mem.index_bytes,
        "compute_scratch_bytes": mem.compute_bytes,
        "process_rss_bytes": process_rss_bytes(),
        "prompt_cache": None
        if cache is None
        else {
            "type": type(cache).__name__,
            "bytes": cache.cache_size,
            "capacity_bytes": cache.capacity_bytes,
            **(cache.stats() if hasattr(cache, "stats") else {}),
        },
    }


# The request type of each route whose body kvgguf checks before llama_cpp.server sees it.
BODY_TYPES = {
    "/v1/completions": "CreateCompletionRequest",
    "/v1/engines/copilot-codex/completions": "CreateCompletionRequest",
    "/v1/chat/completions": "CreateChatCompletionRequest",
    "/v1/embeddings": "CreateEmbeddingRequest",
}


def _error(status: int, message: str, param: Optional[str], code: Optional[str], kind="invalid_request_error"):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def _shape_error(path: str, request):
    """A 400 naming the first field of a JSON body of the wrong shape for its route (llama_cpp.server
    answers 500, with its own source path in the message), or None when the body fits."""
    name = BODY_TYPES.get(path)
    if name is None:
        return None
    if not isinstance(request, dict):
        return _error(
            400, f"The request body must be a JSON object, got {type(request).__name__}", None, "invalid_type"
        )
    import pydantic
    from llama_cpp.server import types

    try:
        getattr(types, name).model_validate(request)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return _error(400, f"Invalid value for '{where}': {first['msg']}", str(first["loc"][0]), "invalid_value")
    return None


def _first_error(e: BaseException) -> BaseException:
    """The error under the task groups a streamed response runs in (ExceptionGroup)."""
    while getattr(e, "exceptions", None):
        e = e.exceptions[0]
    return e


def _stream_error(path: str, request: dict, e: BaseException):
    """A streamed request that failed before its first event, answered as llama_cpp.server answers
    the same request without stream (its own formatters: 400 context_length_exceeded, ...)."""
    from llama_cpp.server import types
    from llama_cpp.server.errors import RouteErrorHandler

    e = _first_error(e)
    body = getattr(types, BODY_TYPES[path]).model_validate(request)
    for pattern, formatter in RouteErrorHandler.pattern_and_formatters.items():
        match = pattern.search(str(e))
        if match is not None:
            status, error = formatter(body, match)
            return _error(status, error["message"], error["param"], error["code"], error["type"])
    print(f"kvgguf serve: a streamed request failed before its first event: {e!r}", file=sys.stderr)
    return _error(500, str(e), None, None, "internal_server_error")


class CheckRequests:
    """ASGI middleware for POST /v1/...: answers what llama_cpp.server would answer wrongly.

    - A body that is not JSON gets 400 (llama_cpp.server: 500).
    - A body of the wrong shape ({"messages": "hi"}) gets 400 naming the field (llama_cpp.server:
      500 with its source file's path).
    - A model this server does not serve gets 404, as OpenAI answers (llama_cpp.server answers with
      its default model).
    - A streamed request that fails before its first event (a prompt longer than n_ctx) gets the
      error a request without stream gets (400 context_length_exceeded). llama_cpp.server sends
      the 200 and the stream's headers before the model runs, then an empty stream with no error
      and no [DONE]: the response start is held here until the first event.

    The body is read once and replayed to the app."""

    def __init__(self, app, aliases):
        self.app = app
        self.aliases = aliases  # () -> the served model names

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            request = json.loads(body)
        except ValueError as e:
            answer = _error(400, f"The request body is not valid JSON: {e}", None, "invalid_json")
            return await answer(scope, receive, send)
        answer = _shape_error(scope["path"], request)
        if answer is not None:
            return await answer(scope, receive, send)
        model = request.get("model") if isinstance(request, dict) else None
        served = list(self.aliases())
        if isinstance(model, str) and model not in served:
            message = f"The model '{model}' does not exist here; this server serves: {', '.join(served)}"
            return await _error(404, message, "model", "model_not_found")(scope, receive, send)
        pending = iter(messages)

        async def replay():
            for message in pending:
                return message
            return await receive()

        if not (isinstance(request, dict) and request.get("stream") is True and scope["path"] in BODY_TYPES):
            return await self.app(scope, replay, send)
        return await self._stream(scope, replay, send, request)

    async def _stream(self, scope, receive, send, request):
        held, flowing = [], False

        async def send_after_first_event(message):
            nonlocal flowing
            if flowing:
                return await send(message)
            held.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                flowing = True
                for m in held:
                    await send(m)
                held.clear()

        try:
            await self.app(scope, receive, send_after_first_event)
        except Exception as e:
            if flowing:
                raise
            return await _stream_error(scope["path"], request, e)(scope, receive, send)
        for m in held:  # a stream that ended without an event and without an error
            await send(m)


def add_memory_route(app) -> None:
    from fastapi import Depends
    from llama_cpp.server.app import get_llama_proxy

    @app.get(MEMORY_ROUTE, summary="KV memory held by kvgguf's cache")
    async def kv_memory(llama_proxy=Depends(get_llama_proxy)):  # under the server's model lock
        return memory_report(llama_proxy())


def run(args) -> int:
    try:
        import uvicorn
        from llama_cpp.server.app import create_app
        from llama_cpp.server.cli import parse_model_from_args
        from llama_cpp.server.settings import ConfigFileSettings, ModelSettings, ServerSettings
    except ImportError as e:
        return _missing_extra(e)

    import kvgguf

    p = build_parser()
    a = p.parse_args(args.args)
    if a.prompt_cache is not None and not (a.prompt_cache == "ram" or a.prompt_cache.startswith(("disk:", "redis://"))):
        p.error(f"--prompt-cache takes 'ram', 'disk:DIR' or 'redis://HOST:PORT/DB', got {a.prompt_cache!r}")
    if a.model_name is not None or (a.model is None and not a.config_file):
        name = a.model_name or a.model or "smollm2-135m"
    else:
        name = a.model
    if name is not None:
        try:
            a.model = str(kvgguf.models.path(name))
        except FileNotFoundError as e:
            p.error(str(e))
        if a.model_alias is None:  # what clients pass as "model" and /v1/models lists
            a.model_alias = name if name in kvgguf.models.names() else Path(a.model).stem
    if a.prompt_cache is not None:
        a.cache = True
        a.cache_type = "ram" if a.prompt_cache == "ram" else "disk"
    if a.prompt_cache_bytes is not None:
        a.cache_size = a.prompt_cache_bytes
    if a.flash_attn is None:
        a.flash_attn = True  # llama.cpp runs flash attention on CPU; kvgguf's figures use it
    if a.interrupt_requests is None:
        # llama_cpp.server's default (true) ends a running stream, empty and without an error, as
        # soon as another request arrives; a prefill is expensive here, so requests wait their turn.
        a.interrupt_requests = False

    kvgguf.install(
        kv_codec=a.kv_codec, kv_attention=a.kv_attention, context_shift=not a.no_context_shift, n_keep=a.keep
    )
    where = a.prompt_cache or ""
    use_compressed_prompt_caches(
        where[len("disk:") :] if where.startswith("disk:") else None, where if where.startswith("redis://") else None
    )
    try:
        if a.config_file:
            with open(a.config_file, "rb") as f:
                if a.config_file.endswith((".yaml", ".yml")):
                    import json

                    import yaml

                    config = ConfigFileSettings.model_validate_json(json.dumps(yaml.safe_load(f)))
                else:
                    config = ConfigFileSettings.model_validate_json(f.read())
            server_settings = ServerSettings.model_validate(config)
            if "interrupt_requests" not in config.model_fields_set:  # queue, as without a config file
                server_settings.interrupt_requests = False
            model_settings = config.models
        else:
            server_settings = parse_model_from_args(ServerSettings, a)
            model_settings = [parse_model_from_args(ModelSettings, a)]
    except Exception as e:  # pydantic's validation errors and unreadable files, as llama_cpp.server reports them
        print(f"kvgguf serve: {e}", file=sys.stderr)
        return 2

    app = create_app(server_settings=server_settings, model_settings=model_settings)
    add_memory_route(app)
    from llama_cpp.server import app as server_app

    app.add_middleware(CheckRequests, aliases=lambda: server_app._llama_proxy._model_settings_dict.keys())
    llm = server_app._llama_proxy()  # loaded by create_app
    print(
        f"kvgguf serve: {llm.model_path}, KV cache {memory_report(llm)['kv_codec'] or 'llama.cpp f16'}; "
        f"{llm.kv_memory()}; prompt cache: {type(llm.cache).__name__ if llm.cache else 'none'}; "
        f"memory at http://{server_settings.host}:{server_settings.port}{MEMORY_ROUTE}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        app,
        host=os.getenv("HOST", server_settings.host),
        port=int(os.getenv("PORT", server_settings.port)),
        ssl_keyfile=server_settings.ssl_keyfile,
        ssl_certfile=server_settings.ssl_certfile,
    )
    return 0

"""`serve`: the flags of the decision server; the server itself is quantbench.server.

The server's own flags (--host … --access-log) derive from its declared settings (quantbench.server.settings), the
backend flags from the backends' declared Options (as `run`'s), the media limit flags from quantbench.limits."""

from __future__ import annotations

import inspect
import typing
from typing import Annotated

import typer

from quantbench import limits
from quantbench.cli.common import _fail
from quantbench.cli.media_flags import (
    MaxAudioSeconds,
    MaxImagePixels,
    MaxMediaBytes,
    MaxMediaParts,
    MaxPartDecodedBytes,
    MaxRequestDecodedBytes,
    MaxVideoFrames,
    MaxVideoSeconds,
    media_limits,
)
from quantbench.cli.run import RunCommand, backend_settings, generic_flag
from quantbench.errors import QuantbenchError
from quantbench.run.settings import GENERIC
from quantbench.server.settings import ServerSettings, declared


def settings_params() -> list[tuple[typer.core.click.Parameter, str | None]]:
    """The server settings' flags, each with the flag it follows: made by typer from a signature built from the
    declarations (the same help rendering as a hand-written flag). A tuple setting is a repeatable flag."""
    hints = typing.get_type_hints(ServerSettings)
    params, anchors = [], []
    for f, default, after in declared():
        hint = hints[f.name]
        if typing.get_origin(hint) is tuple:  # a repeatable flag; left out: the declared default
            hint, default = list[typing.get_args(hint)[0]] | None, None
        how = f.metadata
        option = typer.Option(*([how["flag"]] if how["flag"] else []), help=how["help"], envvar=how["envvar"])
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[hint, option]))
        anchors.append(after)

    def server_settings(**_: object) -> None: ...

    server_settings.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    built = typer.Typer(add_completion=False)
    built.command()(server_settings)
    return list(zip(typer.main.get_command(built).params, anchors, strict=True))


class ServeCommand(RunCommand):
    """`serve`, with the flags of every setting a local backend declares (as `run`: --cuda-graph, --fused-ops,
    --experts-impl, --nvfp4 …), checked against the chosen backend the same way, and the server's own settings'."""

    _settings: list | None = None
    _local: list | None = None

    def option_params(self) -> list:
        """The backend flags but those only remote backends declare: they name a server to call, not a model to
        serve (http's --endpoint, --api-key). Once per command, as the flags they filter: click asks for the
        params several times per invocation, and each look-up reads every distribution's metadata."""
        if self._local is None:
            from quantbench.run.spec import (  # lazy: a fast --help
                installed_backends,
                is_remote,
                options_class,
            )

            installed = installed_backends()
            local = {name for backend in installed if not is_remote(backend, installed)
                     for name in options_class(backend, installed).model_fields}
            self._local = [p for p in super().option_params() if p.name in local]
        return self._local

    def settings_params(self) -> list:
        """settings_params(), once per command: click asks for the params several times per invocation."""
        if self._settings is None:
            self._settings = settings_params()
        return self._settings

    def anchored_params(self) -> list:
        return super().anchored_params() + self.settings_params()

    def invoke(self, ctx):
        names = {param.name for param, _ in self.settings_params()}
        ctx.meta["server_settings"] = {name: ctx.params.pop(name) for name in list(ctx.params) if name in names}
        return super().invoke(ctx)


def serve(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Checkpoint dir or hub id org/name[@revision]. Default: the embedded fixture (or its variant)")] = None,
    backend: Annotated[str, typer.Option(help="bf16 | int4 | nvfp4 | fp8")] = "bf16",
    demo: Annotated[bool, typer.Option(help="Answer one built-in decision, print it, exit")] = False,
    shape: Annotated[str | None, typer.Option(help="Synthetic real-shape model, e.g. qwen3-30b-a3b (random weights, as `run --shape`)")] = None,
    layers: Annotated[int | None, generic_flag("layers")] = GENERIC["layers"].default,
    seed: Annotated[int, typer.Option(help="Synthetic shape: seed of its random weights")] = 0,
    dtype: Annotated[str, generic_flag("dtype")] = GENERIC["dtype"].default,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code")] = False,
    max_media_parts: MaxMediaParts = limits.DEFAULT_MAX_MEDIA_PARTS,
    max_media_bytes: MaxMediaBytes = limits.DEFAULT_MAX_MEDIA_BYTES,
    max_image_pixels: MaxImagePixels = limits.DEFAULT_MAX_IMAGE_PIXELS,
    max_audio_seconds: MaxAudioSeconds = limits.DEFAULT_MAX_AUDIO_SECONDS,
    max_video_frames: MaxVideoFrames = limits.DEFAULT_MAX_VIDEO_FRAMES,
    max_video_seconds: MaxVideoSeconds = limits.DEFAULT_MAX_VIDEO_SECONDS,
    max_part_decoded_bytes: MaxPartDecodedBytes = limits.DEFAULT_MAX_PART_DECODED_BYTES,
    max_request_decoded_bytes: MaxRequestDecodedBytes = limits.DEFAULT_MAX_REQUEST_DECODED_BYTES,
) -> None:
    """Serve the SystemOne decision API (POST /v1/systemone, GET /healthz) over HTTP."""
    from quantbench.server import cli_serve  # lazy: a fast --help

    try:
        # a repeatable flag left out (typer gives an empty tuple) takes its declared default
        given = {name: value for name, value in ctx.meta["server_settings"].items() if value not in (None, ())}
        settings = ServerSettings(**given, media_limits=media_limits(
            max_media_parts=max_media_parts, max_media_bytes=max_media_bytes, max_image_pixels=max_image_pixels,
            max_audio_seconds=max_audio_seconds, max_video_frames=max_video_frames,
            max_video_seconds=max_video_seconds, max_part_decoded_bytes=max_part_decoded_bytes,
            max_request_decoded_bytes=max_request_decoded_bytes))
        options = backend_settings(backend, ctx.meta["backend_options"])
        run = dict(shape=shape, layers=layers, seed=seed, dtype=dtype, trust_remote_code=trust_remote_code, **options)
        raise typer.Exit(cli_serve(model, backend, settings, demo=demo, run=run) or 0)
    except QuantbenchError as e:
        _fail(e)

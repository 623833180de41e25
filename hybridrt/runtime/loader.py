"""`load(dir)`: read the manifest, check the files, open one ONNX Runtime session, check the
graph against the manifest. Every failure is a GraphError or ProviderError naming the fix."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..default_model import DEFAULT_NAME, model_dir
from ..errors import GraphError, ProviderError
from ..graphs.compat import capture_inputs, for_onnxruntime_131, load_graph, needs_query_seqlens
from ..graphs.contract import TensorSpec, present_name
from ..graphs.files import as_path
from ..graphs.manifest import MANIFEST, Manifest, read_manifest, verify_files
from ..graphs.step_graph import control_flow
from .decode_session import DecodeSession, open_pair
from .model import Model
from .providers import CPU, CUDA, ProviderRequest, ProviderSelection, device_of, select_providers, threads_from_env
from .text import load_tokenizer

if TYPE_CHECKING:
    import onnxruntime

log = logging.getLogger("hybridrt.runtime")

ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
}


# Threads of the process-wide pool every session of this process shares, once
# share_thread_pool() has set it up (None: each session has its own pool, onnxruntime's default).
_SHARED_THREADS: int | None = None
_SESSIONS_OPENED = False


def share_thread_pool(threads: int, strict: bool = True) -> bool:
    """Give every session this process opens from now on one pool of `threads` intra-op
    threads. Two models that take turns (a target and its speculative draft) otherwise each
    keep a pool whose threads spin between calls, on the same cores: measured on 2 cores,
    llama-125m float with its int4 draft decoded at 82.6 tok/s with a pool each and 137.4
    with one shared pool (plain decoding 101.9-110.8). Call it before the first load():
    onnxruntime fixes its pools when it opens its first session. Returns whether the pool is
    shared; when it is too late, strict raises ProviderError and otherwise returns False (each
    session then keeps its own pool)."""
    global _SHARED_THREADS
    import onnxruntime as ort

    if _SHARED_THREADS == threads:
        return True
    if _SESSIONS_OPENED or _SHARED_THREADS is not None:
        if not strict:
            return False
        raise ProviderError(
            "share_thread_pool() must come before the first hybridrt.load() of the process "
            "(onnxruntime fixes its thread pools when it opens its first session)"
        )
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ProviderError(f"threads must be an integer >= 1, got {threads!r}")
    ort.capi._pybind_state.set_global_thread_pool_sizes(threads, 1)
    _SHARED_THREADS = threads
    return True


def load(
    path: str | Path,
    provider: ProviderRequest = "auto",
    *,
    allow_fallback: bool = False,
    threads: int | None = None,
    verify: bool = True,
    io_binding: bool | None = None,
    session_options: onnxruntime.SessionOptions | None = None,
    cuda_graph: bool | None = None,
    manifest: Manifest | None = None,
) -> Model:
    """Open an exported directory (or "default") for generation.

    provider: "auto", "cpu", "cuda", "acl", "xnnpack", an ONNX Runtime name, a (name, options) tuple, or a list.
    allow_fallback: run on CPU, with a logged warning, when a named provider is missing.
    threads: intra-op threads of the CPU provider (default: the session options' own count,
      else HYBRIDRT_THREADS, else ONNX Runtime's choice: one per core of the host).
    verify: check every file's sha256 against the manifest (reads the whole graph once).
    io_binding: keep states in buffers bound once with IO binding, KV written in place (the
      default; False: plain session.run, copying every state in and out per step). CPU, 2 threads,
      decode tok/s after 128 / 1,900 prompt tokens, int4, bound vs plain: llama-125m 386.5 / 205.0
      vs 334.8 / 140.6; jamba-125m 240.7 / 225.8 vs 241.3 / 181.5; granite-h-125m 297.7 / 270.9
      vs 304.8 / 225.8.
    session_options: an `onnxruntime.SessionOptions` to open the session with (profiling,
      graph optimization level, session config entries, ...); the session uses this object.
      The loader's settings go into it first and win: `threads` (or a provider tuple's "threads")
      sets intra_op_num_threads; after share_thread_pool() the session uses the shared pool.
      The loader quiets onnxruntime's log to errors only unless log_severity_level was set.
      On onnxruntime 1.31 a fused graph is opened from rewritten bytes (graphs/compat.py), and
      the object also gets the config entry that reads its weights from this directory.
    cuda_graph: capture each decode step as a CUDA graph and replay it (onnxruntime's
      `enable_cuda_graph`, which a ("cuda", {"enable_cuda_graph": "1"}) request also turns on):
      the step's inputs and outputs stay in fixed device buffers, updated in place, and the graph
      is opened with GroupQueryAttention's lengths as inputs (graphs/compat.py).
      onnxruntime refuses the session unless every compute node runs on the GPU (float32
      attention does not: quantize --mode float16 --kv-dtype float16), nor a Scan: a Mamba1
      graph's captured steps run on its one-token form in a second session (decode_session.py);
      on another provider the same graphs and fixed buffers run without capture.
    manifest: the manifest of a directory still being written (export and quantize measure
      their output before they describe it on disk); read from the directory when not given.
    """
    import onnxruntime as ort

    directory, manifest, graph = _directory(path, manifest, verify)
    auto = isinstance(provider, str) and provider.lower() == "auto"
    selection = select_providers(
        provider, ort.get_available_providers(), allow_fallback=allow_fallback, threads=threads
    )
    capture, bind = _capture(selection, cuda_graph), True if io_binding is None else io_binding
    if capture and not bind:
        raise ProviderError("cuda_graph replays steps bound to fixed buffers: it needs io_binding (leave it on)")
    if CUDA in selection.names:
        _preload_cuda(ort)
    session, rewritten, length_inputs, steps = _session(ort, graph, selection, session_options, capture)
    _check_sessions(session, length_inputs, steps, selection, manifest, directory, not (auto or allow_fallback))
    model = _model(directory, manifest, session, bind)
    model.batched_chunks = not rewritten  # 1.31's kernel: a chunk after a past takes one row
    model.cuda_graph, model.length_inputs, model.decode_session = capture, length_inputs, steps
    return model


def _check_sessions(
    session: Any,
    length_inputs: tuple[str, ...],
    steps: DecodeSession | None,
    selection: ProviderSelection,
    manifest: Manifest,
    directory: Path,
    strict: bool,
) -> None:
    """The providers and the IO of the session, and of the decode session where there is one."""
    for opened, inputs in ((session, length_inputs), *([(steps.session, steps.inputs)] if steps else [])):
        _check_providers(opened, selection, strict)
        check_session(opened, manifest, directory, extra_inputs=inputs)


def _model(directory: Path, manifest: Manifest, session: Any, io_binding: bool) -> Model:
    """The Model over an opened session, on the device of its first provider."""
    name = session.get_providers()[0]
    device = device_of(name, session.get_provider_options().get(name, {}))
    return Model(directory, manifest, session, load_tokenizer(directory), device, io_binding=io_binding)


def _directory(path: str | Path, manifest: Manifest | None, verify: bool) -> tuple[Path, Manifest, Path]:
    """The exported directory, its manifest and its graph file, checked (and its files' checksums
    with `verify`)."""
    directory = model_dir(path) if str(path) == DEFAULT_NAME else as_path(path, "the model directory", GraphError)
    manifest = read_manifest(directory) if manifest is None else manifest
    if manifest.format != "onnx":
        raise GraphError(f"{directory} holds a {manifest.format} graph; the runtime runs ONNX (export --format onnx)")
    if verify:
        verify_files(directory, manifest)
    graph = directory / manifest.graph_file
    if not graph.is_file():
        raise GraphError(f"{graph} is missing; the directory is incomplete, re-export the model")
    return directory, manifest, graph


def _capture(selection: ProviderSelection, cuda_graph: bool | None) -> bool:
    """Whether steps are captured (see load): the argument, else the CUDA provider's own
    enable_cuda_graph option; the argument is written into that option."""
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise ProviderError(f"cuda_graph must be True, False or None, got {cuda_graph!r}")
    for name, options in selection.providers:
        if name != CUDA:
            continue
        if cuda_graph is None:
            return str(options.get("enable_cuda_graph", "0")).lower() in ("1", "true")
        options["enable_cuda_graph"] = "1" if cuda_graph else "0"
    return bool(cuda_graph)


def _preload_cuda(ort: Any) -> None:
    """onnxruntime-gpu finds the CUDA and cuDNN libraries that pip's nvidia packages (and
    PyTorch's CUDA wheels) install only once they are loaded: importing torch does it, and so
    does onnxruntime.preload_dlls() (onnxruntime-gpu 1.21+), called here so that a process
    without torch (`hybridrt serve --provider cuda`) finds them too. Where the libraries are
    elsewhere (a system CUDA on the library path) it finds nothing to do."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    try:
        preload()
    except Exception as e:  # the session's own error says what is missing, if anything is
        log.debug("onnxruntime.preload_dlls() failed: %s", e)


def _session(
    ort: Any,
    graph: Path,
    selection: ProviderSelection,
    options: onnxruntime.SessionOptions | None = None,
    capture: bool = False,
) -> tuple[Any, bool, tuple[str, ...], DecodeSession | None]:
    """The session, whether it runs the graph rewritten for onnxruntime 1.31 (compat.py), the
    attention lengths it reads as inputs (rewritten for capture), and for a captured graph with
    control flow the second session that runs its decode steps (runtime/decode_session.py)."""
    opts = _options(ort, selection, options)
    if capture:
        old = not needs_query_seqlens(ort.__version__)
        model = load_graph(graph, "is rewritten for CUDA graph capture")
        try:
            if control_flow(model):
                main, step = open_pair(ort, model, graph, selection, (opts, _options(ort, selection)), not old)
                return main, old, (), step
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph.parent))
            length_inputs = capture_inputs(model, query_seqlens=not old)
            data = model.SerializeToString()
            del model
            return ort.InferenceSession(data, opts, providers=selection.providers), old, length_inputs, None
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ProviderError(
                f"ONNX Runtime cannot capture {graph} as a CUDA graph: {first}; every compute node must run on "
                "the GPU (attention too: quantize --mode float16 --kv-dtype float16), or load without cuda_graph"
            ) from None
    try:
        return ort.InferenceSession(str(graph), opts, providers=selection.providers), False, (), None
    except Exception as e:
        error = e
    # onnxruntime 1.31 (onnxruntime-gpu's newest) refuses the fused graphs' GroupQueryAttention
    # input query_seqlens: open a copy without it (graphs/compat.py), the weights read from here.
    rewritten = None if needs_query_seqlens(ort.__version__) else for_onnxruntime_131(graph)
    if rewritten is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph.parent))
        try:
            return ort.InferenceSession(rewritten, opts, providers=selection.providers), True, (), None
        except Exception as e:
            error = e
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise GraphError(
        f"ONNX Runtime cannot load {graph}: {first}; the file is corrupt (re-export the model) "
        f"or needs a newer onnxruntime than {ort.__version__}"
    ) from None


def _options(
    ort: Any, selection: ProviderSelection, options: onnxruntime.SessionOptions | None = None
) -> onnxruntime.SessionOptions:
    """`options` (or new ones) with the loader's settings: threads, the shared pool, the log level.
    New ones on the CPU's providers also plan no memory pattern: a pattern is one block made for the
    second run of a set of input shapes, so each prompt length seen twice (and each KV capacity)
    made a granite-h-350m prompt call touch 27-41 MB of new memory (7,000-10,500 page faults);
    without it a call takes its tensors from the arena one by one, at the same prompt and step
    times."""
    global _SESSIONS_OPENED
    opts = ort.SessionOptions() if options is None else options
    if options is None and CUDA not in selection.names:
        opts.enable_mem_pattern = False
    if not isinstance(opts, ort.SessionOptions):
        raise ProviderError(f"session_options must be an onnxruntime.SessionOptions, got {type(opts).__name__}")
    if opts.log_severity_level < 0:  # onnxruntime's "unset": warnings and up
        opts.log_severity_level = 3
    if _SHARED_THREADS is not None:
        opts.use_per_session_threads = False  # the process-wide pool of share_thread_pool()
        opts.intra_op_num_threads = 0  # a per-session count contradicts the shared pool
    elif selection.threads is not None:
        opts.intra_op_num_threads = selection.threads
    elif opts.intra_op_num_threads == 0 and (n := threads_from_env()) is not None:
        opts.intra_op_num_threads = n
    _SESSIONS_OPENED = True
    return opts


def _check_providers(session: Any, selection: ProviderSelection, strict: bool) -> None:
    """A provider that is installed can still fail to start (no driver); say so."""
    used = session.get_providers()
    failed = [n for n in selection.names if n != CPU and n not in used and n not in selection.fell_back]
    if not failed:
        return
    if strict:
        raise ProviderError(
            f"execution provider {', '.join(failed)} is installed but could not start (session uses "
            f"{', '.join(used)}); check the driver and libraries, or pass allow_fallback=True"
        )
    log.warning("execution provider %s could not start; running on %s", ", ".join(failed), ", ".join(used))


def check_session(session: Any, manifest: Manifest, directory: Path, extra_inputs: tuple[str, ...] = ()) -> None:
    """The session's inputs and outputs are the manifest's, in order, with its ranks and dtypes
    (besides `extra_inputs`, which a rewrite added: compat.capture_inputs)."""
    for kind, specs, args in (
        ("input", manifest.inputs, [a for a in session.get_inputs() if a.name not in extra_inputs]),
        ("output", manifest.outputs, session.get_outputs()),
    ):
        want, have = [s.name for s in specs], [a.name for a in args]
        if want != have:
            missing = [n for n in want if n not in have]
            extra = [n for n in have if n not in want]
            raise GraphError(
                f"{directory / MANIFEST} does not match {manifest.graph_file}: {kind}s differ "
                f"(manifest only: {missing or 'none'}; graph only: {extra or 'none'}"
                f"{'; order differs' if not missing and not extra else ''}); re-export the model"
            )
        for spec, arg in zip(specs, args):
            problem = _mismatch(spec, arg)
            if problem:
                raise GraphError(
                    f"{directory / MANIFEST} does not match {manifest.graph_file}: {kind} {spec.name} {problem}; "
                    "re-export the model"
                )
    for name in ("input_ids", "logit_positions"):
        if name not in [s.name for s in manifest.inputs]:
            raise GraphError(f"{directory / MANIFEST} declares no {name} input; this is not a hybridrt graph")
    # The runtime relies on logits first, then one present per past in the same order.
    expected = ["logits"] + [present_name(s.name) for s in manifest.pasts]
    if [s.name for s in manifest.outputs] != expected:
        raise GraphError(
            f"{directory / MANIFEST} lists outputs {[s.name for s in manifest.outputs]}, expected {expected}; "
            "this is not a hybridrt graph"
        )
    logits = session.get_outputs()[0]
    vocab = logits.shape[-1] if logits.shape else None
    if isinstance(vocab, int) and vocab != manifest.vocab_size:
        raise GraphError(
            f"{directory / MANIFEST} says vocab_size {manifest.vocab_size} but {manifest.graph_file} gives logits "
            f"over {vocab} tokens; re-export the model"
        )


def _mismatch(spec: TensorSpec, arg: Any) -> str | None:
    if len(arg.shape) != len(spec.dims):
        return f"has rank {len(arg.shape)} in the graph but {len(spec.dims)} in the manifest"
    if ORT_TYPES.get(arg.type, arg.type) != spec.dtype:
        return f"is {arg.type} in the graph but {spec.dtype} in the manifest"
    for g, m in zip(arg.shape, spec.dims):
        if isinstance(g, int) and isinstance(m, int) and g != m:
            return f"has shape {arg.shape} in the graph but {list(spec.dims)} in the manifest"
    return None

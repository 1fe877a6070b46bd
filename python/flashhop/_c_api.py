"""ctypes bindings to the flashhop C API (include/flashhop/flashhop_c.h), from the shared library
that `pip install .` puts next to this file.

The library validates every argument itself and explains what is wrong; this module only turns
tensors into descriptors, the other arguments into the C types, and status codes into Python
exceptions. It rejects only what those types cannot carry.
"""
import ctypes
import pathlib

import torch

_LIBRARY_PATH = pathlib.Path(__file__).with_name("libflashhop_c.so")
_MAX_RANK = 4
_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1

# flashhop_dtype_t
_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.int32: 3, torch.float8_e4m3fn: 4}

# flashhop_status_t
_SUCCESS = 0
_INVALID_ARGUMENT = 1
_NOT_SUPPORTED = 2

# flashhop_pack_gqa_t for pack_gqa None (auto), False (off) and True (on)
_PACK_GQA = {None: 0, False: 1, True: 2}

# flashhop_fp8_scaling_t
FP8_SCALINGS = {"per_tensor": 0, "per_head": 1, "per_block": 2}


class _Tensor(ctypes.Structure):
    """flashhop_tensor_t."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * _MAX_RANK),
        ("stride", ctypes.c_int64 * _MAX_RANK),
        ("device", ctypes.c_int),
    ]


class _ForwardArgs(ctypes.Structure):
    """flashhop_forward_args_t."""

    _fields_ = [
        ("q", _Tensor),
        ("k", _Tensor),
        ("v", _Tensor),
        ("o", _Tensor),
        ("lse", ctypes.POINTER(_Tensor)),
        ("use_softmax_scale", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("use_window", ctypes.c_int),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("pack_gqa", ctypes.c_int),  # flashhop_pack_gqa_t
        ("cu_seqlens_q", ctypes.POINTER(_Tensor)),
        ("cu_seqlens_k", ctypes.POINTER(_Tensor)),
        ("seqused_q", ctypes.POINTER(_Tensor)),
        ("seqused_k", ctypes.POINTER(_Tensor)),
        ("max_seqlen_q", ctypes.c_int),
        ("max_seqlen_k", ctypes.c_int),
        ("page_table", ctypes.POINTER(_Tensor)),
        ("num_splits", ctypes.c_int),
        ("leftpad_k", ctypes.POINTER(_Tensor)),
        ("q_descale", ctypes.POINTER(_Tensor)),
        ("k_descale", ctypes.POINTER(_Tensor)),
        ("v_descale", ctypes.POINTER(_Tensor)),
        ("q_block_scale", ctypes.POINTER(_Tensor)),
        ("k_block_scale", ctypes.POINTER(_Tensor)),
        ("v_block_scale", ctypes.POINTER(_Tensor)),
    ]


class _AppendKvArgs(ctypes.Structure):
    """flashhop_append_kv_args_t."""

    _fields_ = [
        ("k_cache", _Tensor),
        ("v_cache", _Tensor),
        ("page_table", _Tensor),
        ("cache_seqlens", _Tensor),
        ("k_new", _Tensor),
        ("v_new", _Tensor),
        ("cu_seqlens_new", _Tensor),
        ("rotary_cos", ctypes.POINTER(_Tensor)),
        ("rotary_sin", ctypes.POINTER(_Tensor)),
        ("rotary_interleaved", ctypes.c_int),
        ("rotary_seqlens", ctypes.POINTER(_Tensor)),
        ("q", ctypes.POINTER(_Tensor)),
        ("q_rotated", ctypes.POINTER(_Tensor)),
        ("cu_seqlens_q", ctypes.POINTER(_Tensor)),
        ("q_positions_advance", ctypes.c_int),
    ]


class _CombineArgs(ctypes.Structure):
    """flashhop_combine_args_t."""

    _fields_ = [
        ("out_partial", _Tensor),
        ("lse_partial", _Tensor),
        ("out", _Tensor),
        ("lse", ctypes.POINTER(_Tensor)),
    ]


class _QuantizeFp8Args(ctypes.Structure):
    """flashhop_quantize_fp8_args_t."""

    _fields_ = [
        ("x", _Tensor),
        ("out", _Tensor),
        ("descale", _Tensor),
        ("scaling", ctypes.c_int),  # flashhop_fp8_scaling_t
        ("hadamard_signs", ctypes.POINTER(_Tensor)),
    ]


class _BackwardArgs(ctypes.Structure):
    """flashhop_backward_args_t."""

    _fields_ = [
        ("q", _Tensor),
        ("k", _Tensor),
        ("v", _Tensor),
        ("o", _Tensor),
        ("dout", _Tensor),
        ("lse", _Tensor),
        ("dq", _Tensor),
        ("dk", _Tensor),
        ("dv", _Tensor),
        ("use_softmax_scale", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("use_window", ctypes.c_int),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("deterministic", ctypes.c_int),
        ("cu_seqlens_q", ctypes.POINTER(_Tensor)),
        ("cu_seqlens_k", ctypes.POINTER(_Tensor)),
        ("seqused_q", ctypes.POINTER(_Tensor)),
        ("seqused_k", ctypes.POINTER(_Tensor)),
        ("max_seqlen_q", ctypes.c_int),
        ("max_seqlen_k", ctypes.c_int),
    ]


def _load_library():
    try:
        library = ctypes.CDLL(str(_LIBRARY_PATH))
    except OSError as error:
        raise ImportError(
            f"flashhop: cannot load its compiled library {_LIBRARY_PATH} ({error}); "
            "install the package with `pip install .` from the repository root") from error
    args = ctypes.POINTER(_ForwardArgs)
    library.flashhop_forward_workspace_size.argtypes = [args, ctypes.POINTER(ctypes.c_size_t)]
    library.flashhop_forward_workspace_size.restype = ctypes.c_int
    library.flashhop_forward.argtypes = [args, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    library.flashhop_forward.restype = ctypes.c_int
    backward_args = ctypes.POINTER(_BackwardArgs)
    library.flashhop_backward_workspace_size.argtypes = [backward_args, ctypes.POINTER(ctypes.c_size_t)]
    library.flashhop_backward_workspace_size.restype = ctypes.c_int
    library.flashhop_backward.argtypes = [backward_args, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    library.flashhop_backward.restype = ctypes.c_int
    library.flashhop_append_kv.argtypes = [ctypes.POINTER(_AppendKvArgs), ctypes.c_void_p]
    library.flashhop_append_kv.restype = ctypes.c_int
    library.flashhop_combine.argtypes = [ctypes.POINTER(_CombineArgs), ctypes.c_void_p]
    library.flashhop_combine.restype = ctypes.c_int
    library.flashhop_quantize_fp8.argtypes = [ctypes.POINTER(_QuantizeFp8Args), ctypes.c_void_p]
    library.flashhop_quantize_fp8.restype = ctypes.c_int
    library.flashhop_last_error.argtypes = []
    library.flashhop_last_error.restype = ctypes.c_char_p
    return library


_library = _load_library()


def _check(status):
    if status == _SUCCESS:
        return
    message = "flashhop: " + _library.flashhop_last_error().decode(errors="replace")
    if status == _INVALID_ARGUMENT:
        raise ValueError(message)
    if status == _NOT_SUPPORTED:
        raise NotImplementedError(message)
    raise RuntimeError(message)


def _describe(name, tensor):
    """A flashhop_tensor_t viewing `tensor`; ranks above 4 are recorded for the library to reject."""
    if tensor.dtype not in _DTYPES:
        raise ValueError(f"flashhop: {name}.dtype = {tensor.dtype}: expected torch.float16 or torch.bfloat16"
                         " (torch.int32 for cu_seqlens and seqused)")
    desc = _Tensor(data=tensor.data_ptr(), dtype=_DTYPES[tensor.dtype], rank=tensor.dim(),
                   device=tensor.device.index)
    for d in range(min(tensor.dim(), _MAX_RANK)):
        desc.shape[d] = tensor.shape[d]
        desc.stride[d] = tensor.stride(d)
    return desc


def _window_width(name, width):
    """A window width as the C API's int. Past INT32_MAX a width reaches past every key (sequence
    lengths are int32), as INT32_MAX does; below INT32_MIN it cannot be carried, and is as invalid as
    any width below -1."""
    if width < _INT32_MIN:
        raise ValueError(f"flashhop: {name} = {width}: expected -1 (unbounded) or a width >= 0")
    return min(width, _INT32_MAX)


def _options(softmax_scale, causal, window_left, window_right, softcap):
    """The option fields both argument structs share; the window is always given, (-1, -1) being none."""
    return dict(use_softmax_scale=int(softmax_scale is not None),
                softmax_scale=0.0 if softmax_scale is None else softmax_scale, causal=int(causal), use_window=1,
                window_left=_window_width("window_left", window_left),
                window_right=_window_width("window_right", window_right), softcap=softcap)


def _run(workspace_size, run, args, device):
    """Asks the library for the call's workspace, takes it from PyTorch's caching allocator on the
    current stream of `device` and runs the call there: once freed, the block goes only to later
    allocations on that stream, whose work runs after this call."""
    workspace_bytes = ctypes.c_size_t()
    _check(workspace_size(ctypes.byref(args), ctypes.byref(workspace_bytes)))
    workspace = torch.empty(workspace_bytes.value, dtype=torch.uint8, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream
    _check(run(ctypes.byref(args), workspace.data_ptr() or None, workspace_bytes.value, stream))


def forward(q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, pack_gqa, q_descale=None,
            k_descale=None, v_descale=None, q_block_scale=None, k_block_scale=None, v_block_scale=None):
    """Runs the forward kernel into `out` and `lse` on the current stream of q's device, which must
    be the current device; the descales or block scales (FP8 inputs) where given."""
    descs = {"lse": _describe("lse", lse)}
    for name, tensor in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale),
                         ("q_block_scale", q_block_scale), ("k_block_scale", k_block_scale),
                         ("v_block_scale", v_block_scale)):
        if tensor is not None:
            descs[name] = _describe(name, tensor)
    pointers = {name: ctypes.pointer(desc) for name, desc in descs.items()}
    args = _ForwardArgs(q=_describe("q", q), k=_describe("k", k), v=_describe("v", v), o=_describe("o", out),
                        pack_gqa=_PACK_GQA[pack_gqa], **pointers,
                        **_options(softmax_scale, causal, window_left, window_right, softcap))
    _run(_library.flashhop_forward_workspace_size, _library.flashhop_forward, args, q.device)


def _bound(value):
    """A max_seqlen as the C API's int: past INT32_MAX it bounds every int32 length as INT32_MAX
    does; a negative one is passed on for the library to name."""
    return max(min(value, _INT32_MAX), _INT32_MIN)


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, out, lse,
                   softmax_scale, causal, window_left, window_right, softcap, pack_gqa, page_table=None,
                   num_splits=0, leftpad_k=None, descales=(None, None, None)):
    """Runs the variable-length forward into `out` (total_q, nheads, head_dim_v) and `lse` (nheads,
    total_q) on the current stream of q's device, which must be the current device; with
    `page_table`, k and v are a paged cache (num_pages, page_size, nheads_kv, d) and cu_seqlens_k is
    None. num_splits: splits by keys (0: the library chooses); leftpad_k: each sequence's first key
    row of its slot; descales: q's, k's and v's (FP8 inputs) or None each."""
    descs = {"lse": _describe("lse", lse), "cu_seqlens_q": _describe("cu_seqlens_q", cu_seqlens_q)}
    q_descale, k_descale, v_descale = descales
    for name, tensor in (("cu_seqlens_k", cu_seqlens_k), ("seqused_q", seqused_q), ("seqused_k", seqused_k),
                         ("page_table", page_table), ("leftpad_k", leftpad_k), ("q_descale", q_descale),
                         ("k_descale", k_descale), ("v_descale", v_descale)):
        if tensor is not None:
            descs[name] = _describe(name, tensor)
    pointers = {name: ctypes.pointer(desc) for name, desc in descs.items()}
    args = _ForwardArgs(q=_describe("q", q), k=_describe("k", k), v=_describe("v", v), o=_describe("o", out),
                        pack_gqa=_PACK_GQA[pack_gqa], max_seqlen_q=_bound(max_seqlen_q),
                        max_seqlen_k=_bound(max_seqlen_k), num_splits=_bound(num_splits), **pointers,
                        **_options(softmax_scale, causal, window_left, window_right, softcap))
    _run(_library.flashhop_forward_workspace_size, _library.flashhop_forward, args, q.device)


def append_kv(k_cache, v_cache, page_table, cache_seqlens, k_new, v_new, cu_seqlens_new, rotary_cos, rotary_sin,
              rotary_interleaved, rotary_seqlens, q, q_rotated, cu_seqlens_q, q_positions_advance):
    """Writes k_new / v_new (total_new, nheads_kv, d) into the paged cache at cache_seqlens, K rotated
    where the tables are given, and q rotated into q_rotated where q is given, on the current stream
    of the cache's device, which must be the current device."""
    descs = {}
    for name, tensor in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("rotary_seqlens", rotary_seqlens),
                         ("q", q), ("q_rotated", q_rotated), ("cu_seqlens_q", cu_seqlens_q)):
        if tensor is not None:
            descs[name] = _describe(name, tensor)
    pointers = {name: ctypes.pointer(desc) for name, desc in descs.items()}
    args = _AppendKvArgs(k_cache=_describe("k_cache", k_cache), v_cache=_describe("v_cache", v_cache),
                         page_table=_describe("page_table", page_table),
                         cache_seqlens=_describe("cache_seqlens", cache_seqlens), k_new=_describe("k", k_new),
                         v_new=_describe("v", v_new), cu_seqlens_new=_describe("cu_seqlens_new", cu_seqlens_new),
                         rotary_interleaved=int(rotary_interleaved), q_positions_advance=int(q_positions_advance),
                         **pointers)
    stream = torch.cuda.current_stream(k_cache.device).cuda_stream
    _check(_library.flashhop_append_kv(ctypes.byref(args), stream))


def combine(out_partial, lse_partial, out, lse):
    """Merges out_partial (num_splits, rows, nheads, head_dim_v) and lse_partial (num_splits, rows,
    nheads), float32, into `out` (rows, nheads, head_dim_v) and `lse` (nheads, rows) on the current
    stream of their device, which must be the current device."""
    lse_desc = _describe("lse", lse)
    args = _CombineArgs(out_partial=_describe("out_partial", out_partial),
                        lse_partial=_describe("lse_partial", lse_partial), out=_describe("out", out),
                        lse=ctypes.pointer(lse_desc))
    stream = torch.cuda.current_stream(out.device).cuda_stream
    _check(_library.flashhop_combine(ctypes.byref(args), stream))


def quantize_fp8(x, out, descale, scaling, hadamard_signs):
    """Quantizes x (batch, seqlen, nheads, head_dim) into `out` (float8_e4m3fn) and `descale`
    (float32, the shape of `scaling`, a key of FP8_SCALINGS), rotated by hadamard_signs where given,
    on the current stream of x's device, which must be the current device."""
    signs = ctypes.pointer(_describe("hadamard_signs", hadamard_signs)) if hadamard_signs is not None else None
    args = _QuantizeFp8Args(x=_describe("x", x), out=_describe("out", out), descale=_describe("descale", descale),
                            scaling=FP8_SCALINGS[scaling], hadamard_signs=signs)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    _check(_library.flashhop_quantize_fp8(ctypes.byref(args), stream))


def backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, softmax_scale, causal, window_left, window_right,
             softcap, deterministic, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
             max_seqlen_q=0, max_seqlen_k=0):
    """Runs the backward kernels into grad_q, grad_k and grad_v on the current stream of q's device,
    which must be the current device; the options are the forward call's, and with cu_seqlens the
    tensors are a variable-length batch's (as varlen_forward's)."""
    descs = {}
    for name, tensor in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_q", seqused_q),
                         ("seqused_k", seqused_k)):
        if tensor is not None:
            descs[name] = _describe(name, tensor)
    pointers = {name: ctypes.pointer(desc) for name, desc in descs.items()}
    args = _BackwardArgs(q=_describe("q", q), k=_describe("k", k), v=_describe("v", v), o=_describe("o", out),
                         dout=_describe("dout", grad_out), lse=_describe("lse", lse), dq=_describe("dq", grad_q),
                         dk=_describe("dk", grad_k), dv=_describe("dv", grad_v), deterministic=int(deterministic),
                         max_seqlen_q=_bound(max_seqlen_q), max_seqlen_k=_bound(max_seqlen_k), **pointers,
                         **_options(softmax_scale, causal, window_left, window_right, softcap))
    _run(_library.flashhop_backward_workspace_size, _library.flashhop_backward, args, q.device)

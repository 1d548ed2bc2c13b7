"""Run one forward + backward pass of an ``nn.Module`` on fake tensors and record every aten op.

How (no real memory is allocated; a 7B model traces in seconds on a laptop):
- ``FakeTensorMode`` (torch._subclasses.fake_tensor): tensors carry shape, dtype, device and a storage but no
  data. The module is called through ``torch.func.functional_call`` with its state: as it is if it was built
  inside the mode, else fake copies of its parameters and buffers (tied weights stay tied).
- A ``TorchDispatchMode`` under the autograd layer sees every aten op of the forward pass and, because
  ``torch.autograd.grad`` runs under it too, every op of the backward pass. Python control flow on shapes
  and flags (HF / nanoGPT style) simply runs: no symbolic tracing (a branch on tensor values cannot). As in
  ``torch.utils.flop_counter.FlopCounterMode``, an op flop_counter has no formula for is decomposed first when
  it has a decomposition, so both count the same ops.
- Names: forward ops take the path of the innermost module running (forward pre/post hooks); each autograd
  node made in the forward pass is tagged with that path, and a backward op takes the tag of the node the
  engine is running (``torch._C._current_autograd_node``). Ops on the model's output are ``loss/...``.
- Storages are keyed by ``untyped_storage()._cdata`` while every tensor seen stays referenced, so an address
  cannot be reused within a trace and views / in-place results share their base's id.
- Backward phases: a backward op is ``bwd_w`` when everything it creates flows to a parameter gradient
  without leaving its autograd node (the weight-gradient GEMM, the bias reduction; the sum of a tied
  parameter's two gradients may cross nodes), else ``bwd_x``. Values are versioned (an in-place op makes
  a new version) so the flow is a DAG and one reverse sweep decides it.

The loss: a 0-d floating output if the model returns one (nanoGPT with targets, HF with labels), else the sum
of its first floating output (one small reduction; named ``loss/sum``). A model with no trainable parameter
(or ``backward=False``) is traced forward only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from meshplan.errors import SpecError
from meshplan.trace import flops as fl
from meshplan.trace.calls import arg_names, call_attrs, encode_call, result_slots, tags
from meshplan.trace.flops import aten
from meshplan.trace.graph import Storage, TensorInfo, Trace, TracedOp
from meshplan.trace.sdpa import FusedAttention

# metadata queries that are not kernels (as FlopCounterMode skips them)
SKIP = {aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
        aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
        aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
        aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
        torch.ops.prim.layout.default, torch.ops.prim.device.default}
ALLOCATE_ONLY = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}
# factories that take a tensor argument only for its shape, dtype and device (zeros_like is empty_like then zero_,
# aten/src/ATen/native/TensorFactories.cpp): they read none of its bytes
SHAPE_ONLY = ALLOCATE_ONLY | {aten.zeros_like, aten.ones_like, aten.full_like, aten.rand_like, aten.randn_like,
                              aten.randint_like, aten.new_zeros, aten.new_ones, aten.new_full}
TAG = "meshplan_module"


def torch_dtype(name: str, field: str = "dtype") -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise SpecError(f"{field}={name!r} is not a torch dtype (e.g. int64, float32, bfloat16)")
    return value


# matrix products whose operands CUDA and CPU kernels require in one dtype; fake tensors' meta kernels do not check
_MATMULS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm}


def _same_dtype(func: Any, tensors: list[torch.Tensor]) -> None:
    """Raise as eager PyTorch would for a matrix product of mixed dtypes (e.g. an int64 input fed to a Linear)."""
    if func._overloadpacket in _MATMULS and len({t.dtype for t in tensors}) > 1:
        kinds = " and ".join(str(t.dtype).removeprefix("torch.") for t in tensors)
        raise RuntimeError(f"{func._overloadpacket.__name__} of {kinds}: expected one dtype (eager PyTorch fails too)")


class _Real(contextlib.nullcontext):
    """Stands in for FakeTensorMode in a real trace: a context that does nothing, and real tensors pass through."""

    def from_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t


class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each op: arguments, results, FLOPs, storages, module and autograd node."""

    def __init__(self, root_name: str) -> None:
        super().__init__()
        self.root_name = root_name
        self.stack: list[str] = []  # module paths, innermost last
        self.module_prefix = ""  # "loss" once the model has returned
        self.keep: list[torch.Tensor] = []  # every tensor seen: storage addresses stay unique
        self.ids: dict[int, int] = {}  # untyped_storage()._cdata -> storage id
        self.sizes: dict[int, int] = {}
        self.created: dict[int, int] = {}  # storage id -> op index that created it
        self.version: dict[int, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.nodes: list[Any] = []
        self.backward = False
        self.module_calls = 0  # forward calls of the module's submodules (measure/host.py charges each)

    def enter(self, name: str) -> None:
        self.stack.append(name)
        self.module_calls += 1

    def storage(self, t: torch.Tensor) -> tuple[int, bool]:
        """(id, new) of a tensor's storage."""
        key = t.untyped_storage()._cdata
        sid = self.ids.get(key)
        if sid is not None:
            return sid, False
        sid = len(self.ids)
        self.ids[key] = sid
        self.sizes[sid] = t.untyped_storage().nbytes()
        self.keep.append(t)
        return sid, True

    def info(self, t: torch.Tensor) -> TensorInfo:
        sid, _ = self.storage(t)
        return TensorInfo(shape=tuple(int(s) for s in t.shape), dtype=str(t.dtype).removeprefix("torch."),
                          itemsize=t.element_size(), storage=sid, stride=tuple(int(s) for s in t.stride()),
                          offset=int(t.storage_offset()))

    def _module(self, node) -> str:
        """The module an op runs in: its autograd node's forward module in the backward pass."""
        if node is not None:
            self.nodes.append(node)  # keeps its Python object, so id(node) is stable and unique
            return node.metadata.get(TAG, "autograd")
        if self.module_prefix:
            return self.module_prefix
        return self.stack[-1] if self.stack else self.root_name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SKIP:
            return func(*args, **kwargs)
        if _decomposes(func):
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        ins = fl._tensors((args, kwargs))
        _same_dtype(func, ins)
        for t in ins:  # storages that existed before (parameters, inputs, constants)
            sid, new = self.storage(t)
            if new:
                self.created[sid] = -1
        out = func(*args, **kwargs)
        outs = fl._tensors(out) or _written(func, args, kwargs)
        if not outs:
            return out
        index = len(self.rows)
        in_infos = tuple(self.info(t) for t in ins)
        in_ids = {i.storage for i in in_infos}
        fresh: list[int] = []
        mutated: list[int] = []
        out_infos = []
        for t in outs:
            sid, new = self.storage(t)
            if new:
                self.created[sid] = index
                self.version[sid] = 0
                fresh.append(sid)
            elif func._schema.is_mutable:
                mutated.append(sid)
            out_infos.append(self.info(t))
        reads = [(s, self.version.get(s, 0)) for s in sorted(in_ids)]
        for sid in mutated:
            self.version[sid] = self.version.get(sid, 0) + 1
        flops, source = fl.count(func, args, kwargs, out)
        is_view = not fresh and not mutated
        geometry = {"kind": "view"} if is_view else fl.shape(func, args, kwargs, out, flops)
        node = torch._C._current_autograd_node() if self.backward else None
        module = self._module(node)
        written = 0 if is_view or func._overloadpacket in ALLOCATE_ONLY else sum(i.nbytes for i in out_infos)
        read = 0 if is_view or func._overloadpacket in SHAPE_ONLY else sum({(i.storage, i.shape): i.nbytes
                                                                           for i in in_infos}.values())
        self.rows.append({
            "index": index, "func": func, "module": module, "inputs": in_infos, "outputs": tuple(out_infos),
            "flops": flops, "source": source, "geometry": geometry,
            "read": read, "args": arg_names(func, args, kwargs), "results": result_slots(out),
            "attrs": call_attrs(func, args, kwargs),
            "written": written, "node": id(node) if node is not None else None,
            "reads": reads, "creates": [(s, 0) for s in fresh] + [(s, self.version[s]) for s in mutated],
            "outs": outs, "call": encode_call(args, kwargs), "tags": tags(func),
        })
        return out


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an in-place op that returns nothing wrote (``_foreach_add_``: its ``self`` list)."""
    if not func._schema.is_mutable:
        return []
    named = fl.named_args(func, args, kwargs)
    return [t for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write
            for t in fl._tensors(named.get(a.name))]


def _decomposes(func: Any) -> bool:
    """As FlopCounterMode: count the parts of an op that has no FLOP formula (and a decomposition); an element-wise
    op (silu_backward, gelu_backward) is one kernel on a GPU and its FLOPs are counted per element (flops.py), so it
    stays whole."""
    packet = func._overloadpacket
    return packet not in flop_registry and packet not in fl.OWN_FORMULAS and not (
        torch.Tag.pointwise in func.tags or packet in fl.PER_ELEMENT)


def _fake_inputs(mode: FakeTensorMode, inputs: Sequence[Any]) -> list[torch.Tensor]:
    result: list[torch.Tensor] = []
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            result.append(x if isinstance(x, FakeTensor) else mode.from_tensor(x))
            continue
        shape, dtype = x
        if not all(isinstance(s, int) and s > 0 for s in shape):
            raise SpecError(f"input-shape={'x'.join(map(str, shape))!r} (input {i}) must be positive integers")
        with mode:
            result.append(torch.zeros(tuple(shape), dtype=torch_dtype(dtype) if isinstance(dtype, str) else dtype))
    return result


def loss_of(out: Any) -> torch.Tensor | None:
    """The scalar to differentiate, or None when no output needs a gradient (a frozen model: forward only)."""
    floats = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()
              and t.requires_grad]
    if not floats:
        return None
    scalar = [t for t in floats if t.dim() == 0]
    return scalar[0] if scalar else floats[0].sum()


def _accumulates(row: dict[str, Any], final: set) -> bool:
    """The engine summing two partial gradients of one (tied) parameter into its final gradient."""
    return row["func"]._overloadpacket in (aten.add, aten.add_) and all(c in final for c in row["creates"])


def _phases(rows: list[dict[str, Any]], forward_end: int, grad_storages: set[int]) -> list[str]:
    """fwd / bwd_x / bwd_w for every row (see the module docstring)."""
    final = {}
    readers: dict[tuple[int, int], list[int]] = {}
    for r in rows[forward_end + 1:]:
        for v in r["reads"]:
            readers.setdefault(v, []).append(r["index"])
        for v in r["creates"]:
            if v[0] in grad_storages:
                final[v[0]] = v
    final_values = set(final.values())
    w_op: dict[int, bool] = {}
    w_value: dict[tuple[int, int], bool] = {}
    for r in reversed(rows[forward_end + 1:]):
        i = r["index"]
        for v in r["creates"]:
            if v in final_values:
                w_value[v] = True
                continue
            users = [j for j in readers.get(v, []) if j != i and rows[j]["creates"]]  # views only alias
            w_value[v] = bool(users) and all(
                w_op.get(j, False) and (rows[j]["node"] == r["node"] or _accumulates(rows[j], final_values))
                for j in users)
        w_op[i] = bool(r["creates"]) and all(w_value[v] for v in r["creates"])
    return ["fwd" if r["index"] <= forward_end else ("bwd_w" if w_op.get(r["index"]) else "bwd_x") for r in rows]


def _hooks(module: torch.nn.Module, rec: Recorder) -> list[Any]:
    """Forward pre / post hooks on every submodule that keep ``rec``'s module stack (remove them after)."""
    names = {id(m): name for name, m in module.named_modules(remove_duplicate=False) if name}
    hooks = []
    for sub in module.modules():
        if id(sub) in names:
            name = names[id(sub)]
            hooks.append(sub.register_forward_pre_hook(lambda m, a, name=name: rec.enter(name)))
            hooks.append(sub.register_forward_hook(lambda m, a, o: rec.stack.pop() and None))
    return hooks


def trace_module(module: torch.nn.Module, inputs: Sequence[Any], *, backward: bool = True,
                 param_dtype: str | torch.dtype | None = None, real: bool = False, gpu: bool = True) -> Trace:
    """Trace ``module(*inputs)`` and the backward pass of its loss.

    ``inputs``: tensors (real or fake) or ``(shape, dtype)`` pairs, e.g. ``[((2, 32), "int64")]``.
    ``param_dtype``: cast the floating-point parameters and buffers first (e.g. ``"bfloat16"``). ``real``: run on
    the module's real tensors (real inputs too): a model whose shapes depend on values (MoE routing) traces as it runs.
    ``gpu``: a GPU's attention (trace/sdpa.py); False: this CPU's path (check-step)."""
    params: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    fake = next((t for t in [*params.values(), *buffers.values()] if isinstance(t, FakeTensor)), None)
    mode: Any = fake.fake_mode if fake is not None else FakeTensorMode(allow_non_fake_inputs=True)
    if real:
        if fake is not None or not all(isinstance(x, torch.Tensor) for x in inputs):
            raise SpecError("a real trace needs a module with real tensors and real input tensors")
        mode = _Real()
    # the module is called with fake copies of its state (the same tensors if it was built fake), cast if asked
    cast = torch_dtype(param_dtype) if isinstance(param_dtype, str) else param_dtype
    copies: dict[int, torch.Tensor] = {}

    def fake_copy(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in copies:  # tied weights stay tied
            f = t if isinstance(t, FakeTensor) or real else mode.from_tensor(t)
            if cast is not None and f.is_floating_point() and f.dtype != cast:
                with mode:
                    f = f.detach().to(cast).requires_grad_(t.requires_grad)
            copies[id(t)] = f
        return copies[id(t)]

    params = {k: fake_copy(v) for k, v in params.items()}
    buffers = {k: fake_copy(v) for k, v in buffers.items()}
    state = {**params, **buffers}
    args = _fake_inputs(mode, inputs)
    rec = Recorder(type(module).__name__)
    hooks = _hooks(module, rec)
    unique = {id(p): p for p in params.values() if p.requires_grad}
    fused = FusedAttention()
    try:
        with mode, rec, (contextlib.nullcontext() if real or not gpu else fused):
            out = torch.func.functional_call(module, state, tuple(args))
            rec.module_prefix = "loss"
            loss = loss_of(out) if backward else None
            forward_end = len(rec.rows) - 1
            for row in rec.rows:  # tag the autograd nodes of the forward pass with their module path
                for t in row["outs"]:
                    node = t.grad_fn
                    if node is not None and TAG not in node.metadata:
                        node.metadata[TAG] = row["module"]
            grads: tuple[torch.Tensor | None, ...] = ()
            if loss is not None and unique:
                rec.backward = True
                grads = torch.autograd.grad(loss, list(unique.values()), allow_unused=True)
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise SpecError(f"the model's control flow or shapes depend on tensor values ({exc.func}): it cannot be "
                        "traced with fake tensors") from None
    finally:
        for h in hooks:
            h.remove()
    return replace(_assemble(rec, module, params, buffers, args, grads, forward_end), fused_dropout=fused.calls)


def traced_ops(rows: list[dict[str, Any]], phases: Sequence[str]) -> list[TracedOp]:
    """The recorder's rows as TracedOp records, one phase each."""
    ops = []
    for r, phase in zip(rows, phases, strict=True):
        g = r["geometry"]
        packet = r["func"]._overloadpacket.__name__
        ops.append(TracedOp(
            index=r["index"], name=f"{r['module']}/{packet}", target=str(r["func"]), phase=phase, kind=g["kind"],
            inputs=r["inputs"], outputs=r["outputs"], flops=r["flops"], flops_source=r["source"],
            bytes_read=float(r["read"]), bytes_written=float(r["written"]), m=float(g.get("m", 0.0)),
            n=float(g.get("n", 0.0)), k=float(g.get("k", 0.0)), groups=float(g.get("groups", 1.0)),
            causal=bool(g.get("causal", False)), module=r["module"], call=r["call"], tags=r["tags"], args=r["args"],
            results=r["results"], attrs=r["attrs"]))
    return ops


def _assemble(rec: Recorder, module: torch.nn.Module, params: dict, buffers: dict, args: list,
              grads: tuple, forward_end: int) -> Trace:
    roles: dict[int, str] = {}
    for t in args:
        roles[rec.storage(t)[0]] = "input"
    for t in buffers.values():
        roles[rec.storage(t)[0]] = "buffer"
    for t in params.values():
        roles[rec.storage(t)[0]] = "param"
    grad_ids = {rec.storage(g)[0] for g in grads if g is not None}
    for sid in grad_ids:
        roles[sid] = "grad"
    for sid in rec.sizes:
        created = rec.created.get(sid, -1)
        if sid not in roles:
            roles[sid] = "buffer" if created < 0 else ("activation" if created <= forward_end else "temporary")
    ops = traced_ops(rec.rows, _phases(rec.rows, forward_end, grad_ids))
    storages = {sid: Storage(id=sid, nbytes=size, role=roles[sid], created=rec.created.get(sid, -1))
                for sid, size in rec.sizes.items()}
    unique = {rec.storage(p)[0]: p for p in params.values()}
    trainable = [p for p in {id(p): p for p in params.values() if p.requires_grad}.values()]
    grad_of = {rec.storage(p)[0]: rec.storage(g)[0] for p, g in zip(trainable, grads, strict=False) if g is not None}
    names: dict[int, str] = {}
    for name, t in (*buffers.items(), *params.items()):
        names.setdefault(rec.storage(t)[0], name)
    return Trace(name=type(module).__name__, ops=tuple(ops), storages=storages, grad_of=grad_of, names=names,
                 params=sum(p.numel() for p in unique.values()),
                 param_bytes=sum(storages[s].nbytes for s in unique), forward_end=forward_end,
                 module_calls=rec.module_calls + 1)  # the root's own call

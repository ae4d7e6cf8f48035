"""Every Triton kernel of the project compiles for sm_90 (H100) on a machine without a GPU.

`triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32))` runs the
whole pipeline (TTIR -> TTGIR -> LLVM IR -> PTX -> cubin through the ptxas bundled with the triton wheel) with no
CUDA driver, so a kernel that would fail to compile on the GPU fails here, in CPU CI.

Without a GPU the test suite imports the kernels under `TRITON_INTERPRET=1` (tests/conftest.py), where
`@triton.jit` makes interpreter objects that cannot be compiled. So the compiles run in fresh Python processes
(`WORKERS` of them, each running this file as a script and taking the next unclaimed case) with
`TRITON_INTERPRET=0` and an empty Triton cache, so every case really goes through ptxas.
`test_every_kernel_has_a_compile_case` reads the kernels from the sources and from the imported modules, so a new
kernel without a compile case fails.

Each case is one configuration a Python wrapper launches: the pointer element types it passes, and the constexprs
(one case per distinct constexpr branch, at the block sizes the wrapper picks for real inputs; never larger).
Parameters the wrappers pass as the integer 1 (the last strides of contiguous tensors) are listed in `ones`:
Triton specialises those to the constant 1 at launch, and so does the case. Pointers carry the 16-byte
divisibility hint a fresh torch allocation gets.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
import traceback
import types
from pathlib import Path

import pytest
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, KernelInterface

ROOT = Path(__file__).resolve().parents[2]
TARGET = ("cuda", 90, 32)  # GPUTarget(backend, compute capability, warp size): H100
SMEM_LIMIT = 227 * 1024  # H100: most shared memory one block may use (bytes)
REGS_PER_THREAD = 255
REGS_PER_SM = 64 * 1024
WORKERS = max(1, min(4, os.cpu_count() or 1))  # compile processes side by side (2 on the 2-core CI machine)
TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Case:
    """One launch configuration of `module.kernel`.

    pointers: parameter -> element type of the tensor passed ("fp32", "bf16", "i64", "i8", ...);
    scalars: type of every other runtime parameter not in `ones` (the wrappers pass Python ints < 2**31);
    ones: parameters passed as the int 1 (specialised to the constant 1, as Triton does at launch);
    constexprs: the tl.constexpr parameters' values;
    num_warps: the launch option (every wrapper's default is 4).
    """

    id: str
    module: str
    kernel: str
    pointers: dict
    constexprs: dict = dataclasses.field(default_factory=dict)
    ones: tuple = ()
    scalars: str = "i32"
    num_warps: int = 4

    def signature(self, arg_names: list[str], constexpr_params: set[str]) -> tuple[dict, dict]:
        """(signature, constexprs) for `ASTSource`: "*fp32"-style pointer types, "i32" scalars, "constexpr"."""
        known = set(arg_names)
        for field in ("pointers", "constexprs", "ones"):
            unknown = set(getattr(self, field)) - known
            assert not unknown, f"{self.id}: {field} names {sorted(unknown)}, not parameters of {self.kernel}"
        missing = constexpr_params - set(self.constexprs)
        assert not missing, f"{self.id}: no value for the constexpr parameters {sorted(missing)}"
        sig, consts = {}, {}
        for name in arg_names:
            if name in self.constexprs or name in self.ones:
                sig[name] = "constexpr"
                consts[name] = self.constexprs.get(name, 1)
            elif name in self.pointers:
                sig[name] = "*" + self.pointers[name]
            else:
                assert not name.endswith("_ptr"), f"{self.id}: give the element type of pointer {name!r}"
                sig[name] = self.scalars
        return sig, consts


def _ptrs(dtype: str, names: str) -> dict:
    return dict.fromkeys(names.split(), dtype)


CV = "multispec.kernels.chain_verify"
TV = "multispec.kernels.tree_verify"
NB = "multispec.image_ar.neighbourhood"
TJ = "multispec.image_ar.continuous.trajectory_kernel"
SSM = "multispec.ssm.kernels"
DR = "multispec.ssm.delta_rule"

# BLOCK_V / BLOCK_K / BLOCK: the wrappers take next_power_of_2(size), at least 16, capped at 4096 (1024 for the
# neighbour table); 4096 is what every real vocabulary gets, 16 the smallest tile. Greedy vs random rows of the
# random walks is a runtime flag (greedy_ptr), not a constexpr: one compile covers both.
_CHAIN_RANDOM = {**_ptrs("i64", "out_ptr acc_ptr draft_ptr num_ptr"), **_ptrs("fp32", "p_ptr q_ptr u_ptr e_ptr"),
                 "greedy_ptr": "i8"}
_TREE_RANDOM = {**_ptrs("i64", "out_ptr path_ptr acc_ptr tok_ptr fc_ptr ns_ptr"),
                **_ptrs("fp32", "p_ptr q_ptr u_ptr e_ptr ws_ptr"), "greedy_ptr": "i8"}

CASES = [
    # ---- multispec.kernels (chain_verify_greedy / chain_verify_random, tree_verify_greedy / tree_verify_random)
    Case("chain_greedy", CV, "_chain_greedy_kernel", _ptrs("i64", "out_ptr acc_ptr draft_ptr num_ptr argmax_ptr")),
    Case("chain_random-q-4096", CV, "_chain_random_kernel", _CHAIN_RANDOM, dict(HAS_Q=True, BLOCK_V=4096)),
    Case("chain_random-noq-4096", CV, "_chain_random_kernel", _CHAIN_RANDOM, dict(HAS_Q=False, BLOCK_V=4096)),
    Case("chain_random-q-16", CV, "_chain_random_kernel", _CHAIN_RANDOM, dict(HAS_Q=True, BLOCK_V=16)),
    Case("tree_greedy", TV, "_tree_greedy_kernel",
         _ptrs("i64", "out_ptr path_ptr acc_ptr tok_ptr fc_ptr ns_ptr argmax_ptr")),
    Case("tree_random-q-4096", TV, "_tree_random_kernel", _TREE_RANDOM, dict(HAS_Q=True, BLOCK_V=4096)),
    Case("tree_random-noq-4096", TV, "_tree_random_kernel", _TREE_RANDOM, dict(HAS_Q=False, BLOCK_V=4096)),
    Case("tree_random-noq-16", TV, "_tree_random_kernel", _TREE_RANDOM, dict(HAS_Q=False, BLOCK_V=16)),
    # ---- image_ar (neighbour_mass, trajectory_log_ratio)
    Case("neighbour_mass-1024", NB, "_neighbour_mass_kernel",
         {**_ptrs("fp32", "p_ptr budget_ptr mass_ptr"), **_ptrs("i64", "tok_ptr nb_ptr count_ptr")},
         dict(BLOCK_K=1024)),
    Case("neighbour_mass-16", NB, "_neighbour_mass_kernel",
         {**_ptrs("fp32", "p_ptr budget_ptr mass_ptr"), **_ptrs("i64", "tok_ptr nb_ptr count_ptr")},
         dict(BLOCK_K=16)),
    Case("trajectory_log_ratio-4096", TJ, "_trajectory_log_ratio_kernel",
         _ptrs("fp32", "x_ptr p_ptr q_ptr std_ptr out_ptr"), dict(BLOCK=4096)),
    # ---- ssm.kernels (tree_ssd_triton, tree_conv1d_triton): the kernels change often; keep these in step.
    # x, dt, B, C, D (and the conv's xbc, state, weight, bias) come in the model's dtype: bf16 for the model-sized
    # cases, fp32 for the small ones (the test and zoo models); h0 and y are fp32, the ancestor mask int8.
    # tree_ssd_chunk_kernel: BT = _block(nodes, 64), BP = _block(head_dim, 64), BN = _block(state, 64) (powers of
    # two >= 16); Mamba-2 checkpoints have head_dim 64 and state 128, the zoo 32 and 32. p_blocks = cdiv(head_dim,
    # BP) is 1 for both. PRECISION: ssm.kernels.SCAN_PRECISION. The last stride of each tensor is 1.
    Case("tree_ssd-D-bf16-64x64x64", SSM, "tree_ssd_chunk_kernel",
         {**_ptrs("bf16", "x_ptr dt_ptr b_ptr c_ptr d_ptr"), **_ptrs("fp32", "a_ptr h0_ptr y_ptr"), "anc_ptr": "i8"},
         dict(HAS_D=True, BT=64, BP=64, BN=64, PRECISION="tf32x3"),
         ones=("p_blocks", "sxp", "sdh", "sbn", "scn", "sas", "shn", "syp")),
    Case("tree_ssd-noD-fp32-16x32x32", SSM, "tree_ssd_chunk_kernel",
         {**_ptrs("fp32", "x_ptr dt_ptr a_ptr b_ptr c_ptr d_ptr h0_ptr y_ptr"), "anc_ptr": "i8"},
         dict(HAS_D=False, BT=16, BP=32, BN=32, PRECISION="tf32x3"),
         ones=("p_blocks", "sxp", "sdh", "sbn", "scn", "sas", "shn", "syp")),
    # tree_conv_kernel: K = conv width (4 in every Mamba), BTN = min(16, next_power_of_2(nodes)), BC = min(128,
    # next_power_of_2(channels)); WALK = no precomputed sources (the targets pass them; a bare call does not, and
    # then the source strides are 0).
    Case("tree_conv-sources-bias-bf16-16x128", SSM, "tree_conv_kernel",
         {**_ptrs("bf16", "xbc_ptr state_ptr w_ptr bias_ptr"), **_ptrs("i64", "src_ptr par_ptr"), "out_ptr": "fp32"},
         dict(K=4, HAS_BIAS=True, WALK=False, BTN=16, BC=128), ones=("sxc", "ssk", "srk", "spt", "swk", "soc")),
    Case("tree_conv-walk-nobias-fp32-4x32", SSM, "tree_conv_kernel",
         {**_ptrs("fp32", "xbc_ptr state_ptr w_ptr bias_ptr out_ptr"), **_ptrs("i64", "src_ptr par_ptr")},
         dict(K=4, HAS_BIAS=False, WALK=True, BTN=4, BC=32), ones=("sxc", "ssk", "spt", "swk", "soc")),
    # tree_delta_rule_kernel: everything fp32 (the wrapper converts), parents int64; BK = next_power_of_2(Dk),
    # BV = min(64, next_power_of_2(Dv)): Qwen3-Next's heads (128 x 128) and a small head (16 x 16)
    Case("tree_delta_rule-128x64", DR, "tree_delta_rule_kernel",
         {**_ptrs("fp32", "q_ptr k_ptr v_ptr g_ptr beta_ptr h0_ptr out_ptr st_ptr"), "par_ptr": "i64"},
         dict(BK=128, BV=64), ones=("sqd", "svd", "sgh", "spt", "shv", "sov", "ssv")),
    Case("tree_delta_rule-16x16", DR, "tree_delta_rule_kernel",
         {**_ptrs("fp32", "q_ptr k_ptr v_ptr g_ptr beta_ptr h0_ptr out_ptr st_ptr"), "par_ptr": "i64"},
         dict(BK=16, BV=16), ones=("sqd", "svd", "sgh", "spt", "shv", "sov", "ssv")),
]
CASE_BY_ID = {c.id: c for c in CASES}
assert len(CASE_BY_ID) == len(CASES), "case ids must be unique"

# modules that hold kernels, besides multispec.kernels.*; any other module with a `@triton.jit` line is found by
# `_grepped_kernels`
KERNEL_MODULES = (SSM, DR, NB, TJ)


# ---- the compile (runs in the worker processes: TRITON_INTERPRET=0) -----------------------------------------


def _resource_usage(cubin: bytes) -> dict:
    """Registers, stack frame (spills), static shared and local memory of the cubin's kernel, as the cuobjdump
    shipped with triton reads them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out))
    keys = {"REG": "regs", "STACK": "stack", "SHARED": "static_shared", "LOCAL": "local"}
    return {keys[k]: int(v) for k, v in found.items()}


def _import_bare(name: str):
    """Import the kernel module `name` without running the project's top package __init__ files (multispec's
    imports transformers and the drafters: ~10 s of a ~15 s import, per worker; a kernel module needs none of
    it): the packages of pyproject's package-dir are first registered as empty packages over their folders.
    Should a kernel module need its package's __init__, the ordinary import is taken instead."""
    for package, folder in {pkg: folder for folder, pkg in _package_dirs().items()}.items():
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(folder)]
            sys.modules[package] = stub
    try:
        return importlib.import_module(name)
    except ImportError:
        for loaded in [m for m in sys.modules if m == "multispec" or m.startswith("multispec.")]:
            del sys.modules[loaded]
        return importlib.import_module(name)


def _compile_case(case: Case) -> dict:
    module = _import_bare(case.module)
    fn = _unwrap(getattr(module, case.kernel, None))
    assert fn is not None, f"{case.module} has no kernel {case.kernel!r} (renamed or removed? edit CASES)"
    assert isinstance(fn, JITFunction), f"{case.module}.{case.kernel} is a {type(fn).__name__}, not a JITFunction"
    names = list(fn.arg_names)
    sig, consts = case.signature(names, {p.name for p in fn.params if p.is_constexpr})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if sig[name].startswith("*")}
    start = time.perf_counter()
    src = ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget(*TARGET), options={"num_warps": case.num_warps})
    seconds = time.perf_counter() - start
    cubin = kernel.asm["cubin"]
    meta = kernel.metadata
    return {"triton": triton.__version__, "seconds": round(seconds, 2), "name": meta.name, "arch": meta.target.arch,
            "num_warps": meta.num_warps, "shared": meta.shared, "cubin_bytes": len(cubin),
            "elf": cubin[:4] == b"\x7fELF", **_resource_usage(cubin)}


def _worker(workdir: str) -> None:
    """Compile cases until none is left unclaimed (a case is claimed by creating workdir/claims/<id>, so the
    workers share the list as they go); results, {id: result or {"error": ...}}, go to
    workdir/results-<pid>.json after each case."""
    work = Path(workdir)
    out = work / f"results-{os.getpid()}.json"
    results = {}
    for case in CASES:
        try:
            with (work / "claims" / case.id).open("x") as claim:
                claim.write(str(os.getpid()))
        except FileExistsError:
            continue
        try:
            results[case.id] = _compile_case(case)
        except BaseException as e:  # noqa: BLE001 - every failure is reported with its case
            results[case.id] = {"error": f"{type(e).__name__}: {e}"[-6000:],
                                "traceback": traceback.format_exc()[-6000:]}
        out.write_text(json.dumps(results))


# ---- the tests -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """{case id: result}: every case compiled, by WORKERS processes side by side."""
    work = tmp_path_factory.mktemp("sm90")
    (work / "claims").mkdir()
    # no inherited Triton / MLIR settings (interpreter, cache, arch override, IR dumps) but the tools' paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "MLIR_", "LLVM_"))
           or (k.startswith("TRITON_") and k.endswith("_PATH")) or k == "TRITON_HOME"}
    env.update(TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(work / "cache"), TRITON_ALWAYS_COMPILE="1")
    procs = []
    for i in range(WORKERS):
        log = open(work / f"log{i}.txt", "w+")
        procs.append((subprocess.Popen([sys.executable, __file__, str(work)], cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + TIMEOUT_S
    logs = {}
    for proc, log in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        logs[str(proc.pid)] = (proc.returncode, log.read()[-4000:])
        log.close()
    results = {}
    for path in work.glob("results-*.json"):
        results.update(json.loads(path.read_text()))
    for case in CASES:
        if case.id not in results:
            claim = work / "claims" / case.id
            pid = claim.read_text() if claim.exists() else None
            rc, tail = logs.get(pid, (None, "(no worker claimed it)"))
            results[case.id] = {"error": f"no result: the compile worker (exit status {rc}) stopped first "
                                         f"(timeout {TIMEOUT_S} s?); its output:\n{tail}"}
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_compiles_for_sm90(case, compiled):
    res = compiled[case.id]
    assert "error" not in res, f"{case.module}.{case.kernel} [{case.id}] does not compile for sm_90:\n" \
                               f"{res['error']}\n{res.get('traceback', '')}"
    assert res["name"] == case.kernel and res["arch"] == TARGET[1] and res["num_warps"] == case.num_warps
    assert res["elf"] and res["cubin_bytes"] > 0, "no cubin"
    threads = res["num_warps"] * TARGET[2]
    assert 0 < res["regs"] <= REGS_PER_THREAD, res
    assert res["regs"] * threads <= REGS_PER_SM, f"{res['regs']} registers x {threads} threads: not launchable"
    assert res["shared"] <= SMEM_LIMIT, f"{res['shared']} bytes of shared memory; an H100 block has {SMEM_LIMIT}"


# -- discovery: every kernel in the project has a compile case


def _package_dirs() -> dict[Path, str]:
    """Source folder -> import name, from pyproject's [tool.setuptools] package-dir."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = conf["tool"]["setuptools"]["package-dir"]
    return {(ROOT / folder).resolve(): name for name, folder in dirs.items()}


def _module_name(path: Path, package_dirs: dict[Path, str]) -> str:
    for folder, name in sorted(package_dirs.items(), key=lambda kv: -len(kv[0].parts)):
        if path.is_relative_to(folder):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            break
    else:  # a top-level folder on the test path (demos/, benchmarks/)
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _jit_decorators(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the triton module, names bound to triton.jit) in a module's imports."""
    modules, jits = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "triton"}
        elif isinstance(node, ast.ImportFrom) and node.module == "triton":
            jits |= {a.asname or a.name for a in node.names if a.name == "jit"}
    return modules, jits


def _is_jit_decorator(node: ast.expr, modules: set[str], jits: set[str]) -> bool:
    """`@triton.jit`, `@triton.jit(...)`, or `@jit` / `@jit(...)` after `from triton import jit`."""
    node = node.func if isinstance(node, ast.Call) else node
    if isinstance(node, ast.Attribute):
        return node.attr == "jit" and isinstance(node.value, ast.Name) and node.value.id in modules
    return isinstance(node, ast.Name) and node.id in jits


def _source_files():
    """The repo's .py files: hidden folders (.git, .venv), __pycache__, build and tests/ pruned."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "build")
                         and not (Path(folder) == ROOT and d == "tests"))
        yield from (Path(folder) / f for f in sorted(files) if f.endswith(".py"))


def _grepped_kernels() -> dict[str, set[str]]:
    """module -> names of the functions decorated with triton.jit in its source, for every file of
    `_source_files` with a `@...jit` line."""
    package_dirs = _package_dirs()
    found: dict[str, set[str]] = {}
    for path in _source_files():
        text = path.read_text(errors="replace")
        if not re.search(r"^\s*@[\w.]*jit\b", text, re.MULTILINE):
            continue
        tree = ast.parse(text, str(path))
        modules, jits = _jit_decorators(tree)
        names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and any(_is_jit_decorator(d, modules, jits) for d in node.decorator_list)}
        if names:
            found.setdefault(_module_name(path.resolve(), package_dirs), set()).update(names)
    return found


def _unwrap(obj):
    """The JIT function under @triton.autotune / @triton.heuristics wrappers (which keep it as `.fn`)."""
    while isinstance(obj, KernelInterface) and not isinstance(obj, (JITFunction, InterpretedFunction)):
        obj = getattr(obj, "fn", None)
    return obj


def _is_jit(obj) -> bool:
    return isinstance(_unwrap(obj), (JITFunction, InterpretedFunction))


def _imported_kernels(modules) -> dict[str, dict[str, object]]:
    """module -> {name: JIT function defined there} from the imported modules."""
    out = {}
    for name in modules:
        mod = importlib.import_module(name)
        out[name] = {k: _unwrap(v) for k, v in vars(mod).items() if _is_jit(v) and _unwrap(v).fn.__module__ == name}
    return out


def _called_jit(fn, seen: dict) -> None:
    """Add to `seen` ((module, name) -> function) every JIT function `fn` calls, transitively (names of its
    body resolved in its module's globals, `module.attr` chains included)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain, target = [], node.func
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if not isinstance(target, ast.Name) or target.id not in fn.fn.__globals__:
            continue
        obj = fn.fn.__globals__[target.id]
        for attr in reversed(chain):
            obj = getattr(obj, attr, None)
        obj = _unwrap(obj)
        if _is_jit(obj) and not obj.fn.__module__.startswith("triton"):
            key = (obj.fn.__module__, obj.fn.__name__)
            if key not in seen:
                seen[key] = obj
                _called_jit(obj, seen)


def test_every_kernel_has_a_compile_case():
    """Every JIT function in the project is a kernel with a case in CASES or a device function called (directly
    or not) by one; so a new kernel, or a renamed one, without a compile case fails here."""
    grepped = _grepped_kernels()
    kernel_pkg = importlib.import_module("multispec.kernels")
    walked = [m.name for m in pkgutil.walk_packages(kernel_pkg.__path__, "multispec.kernels.")]
    modules = sorted({*walked, *KERNEL_MODULES, *grepped})
    imported = _imported_kernels(modules)
    found = {(m, n) for m, names in imported.items() for n in names}
    found |= {(m, n) for m, names in grepped.items() for n in names}
    assert {case.module for case in CASES} <= set(modules), "a case names a module the walk does not reach"

    cased = {(c.module, c.kernel) for c in CASES}
    called: dict = {}
    for module, name in sorted(cased):
        fn = imported.get(module, {}).get(name)
        if fn is not None:
            _called_jit(fn, called)
    without = sorted(found - cased - set(called))
    assert not without, ("Triton kernels without a compile case in tests/kernels/test_sm90_compile.py CASES "
                         f"(add one per constexpr configuration their wrapper launches): {without}")
    stale = sorted(cased - found)
    assert not stale, f"CASES name kernels that no longer exist: {stale}"


if __name__ == "__main__":  # a compile worker: python test_sm90_compile.py WORKDIR
    _worker(sys.argv[1])

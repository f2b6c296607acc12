"""The ctypes types each kernel module declares (``SIGNATURES``) against the C source's exported functions.

Every function a kernel's C file exports (defined at file scope, not ``static``; ``#ifdef`` ignored, so the
AMX build's ``poolgate_amx_init`` counts) is read from the source text, its C types mapped to ctypes
(int64_t -> c_int64, int32_t -> c_int32, int -> c_int, float -> c_float, double -> c_double, any pointer ->
c_void_p, ``(void)`` -> no arguments), and compared type by type with the module's declaration, which
``cbuild.bind`` gives the loaded function: a changed C signature fails here, on any machine, compiler or not.
"""
import ctypes
import re

import pytest

from poolgate.workers.kernels import cpu_attention, fused_norm, gelu_f32

C_TYPES = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "int": ctypes.c_int, "float": ctypes.c_float,
           "double": ctypes.c_double, "void": None}
DEFINITION = re.compile(r"^(?!static\b)([A-Za-z_][\w \t*]*?)\b(\w+)\s*\(([^)]*)\)\s*\{", re.M)
MODULES = [cpu_attention, fused_norm, gelu_f32]


def _ctype(decl: str):
    """The ctypes type of one C declaration (a parameter with its name, or a return type)."""
    words = decl.replace("*", " * ").split()
    if "*" in words:
        return ctypes.c_void_p
    words = [w for w in words if w not in ("const", "volatile", "restrict", "unsigned", "signed")]
    base = words[0]  # the type; a parameter's name follows it
    if base not in C_TYPES:
        raise AssertionError(f"no ctypes mapping for C type {base!r} in {decl!r}: add one to C_TYPES")
    return C_TYPES[base]


def exported(source: str) -> dict[str, tuple]:
    """name -> (restype, argtypes) of each function ``source`` defines at file scope and does not make static."""
    text = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out = {}
    for ret, name, params in DEFINITION.findall(text):
        params = " ".join(params.split())
        args = () if params in ("", "void") else tuple(_ctype(p) for p in params.split(","))
        out[name] = (_ctype(ret), args)
    return out


def _names(types) -> list[str]:
    return [getattr(t, "__name__", str(t)) for t in types]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.SOURCE.name)
def test_every_exported_function_is_declared_type_by_type(module):
    found = exported(module.SOURCE.read_text())
    assert found, f"no exported function found in {module.SOURCE.name}"
    assert sorted(found) == sorted(module.SIGNATURES), (module.SOURCE.name, sorted(found))
    for name, (restype, argtypes) in found.items():
        declared_ret, declared_args = module.SIGNATURES[name]
        assert declared_ret is restype, (name, "return", declared_ret, restype)
        assert len(declared_args) == len(argtypes), (name, _names(declared_args), _names(argtypes))
        for i, (have, want) in enumerate(zip(declared_args, argtypes, strict=True)):
            assert have is want, f"{name} argument {i}: declared {have.__name__}, the C source has {want.__name__}"


def test_the_reader_sees_each_kind_of_change():
    """A parameter's type changed, one added, the return type changed, a new export, a static helper: the
    reader reports each, so the comparison above would fail on it."""
    source = cpu_attention.SOURCE.read_text()
    base = exported(source)
    assert base["poolgate_attend"][1][12] is ctypes.c_float and base["poolgate_amx_init"] == (ctypes.c_int, ())
    changed = exported(source.replace("float scale, int causal", "double scale, int causal"))
    assert changed["poolgate_attend"][1][12] is ctypes.c_double
    added = exported(source.replace("int64_t item0, int64_t item1)", "int64_t item0, int64_t item1, int flags)"))
    assert added["poolgate_attend"][1][-1] is ctypes.c_int and len(added["poolgate_attend"][1]) == 20
    returns = exported(source.replace("int poolgate_amx_init(void)", "int64_t poolgate_amx_init(void)"))
    assert returns["poolgate_amx_init"][0] is ctypes.c_int64
    extra = exported(source + "\nvoid poolgate_new(const float* x, int32_t n) {}\n"
                     "static int hidden(int a) { return a; }\n")
    assert extra["poolgate_new"] == (None, (ctypes.c_void_p, ctypes.c_int32)) and "hidden" not in extra


@pytest.mark.skipif(cpu_attention.unavailable() is not None or fused_norm.unavailable() is not None,
                    reason=f"the kernels do not load here: {cpu_attention.unavailable() or fused_norm.unavailable()}")
def test_the_loaded_functions_carry_the_declared_types():
    for fn, module, name in ((cpu_attention._kernel(32), cpu_attention, "poolgate_attend"),
                             (fused_norm._kernel(), fused_norm, "poolgate_add_layer_norm")):
        restype, argtypes = module.SIGNATURES[name]
        assert fn.restype is restype and list(fn.argtypes) == list(argtypes), name

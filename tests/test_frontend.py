"""The frontend: loading model files, tracing on fake tensors, importing into the dialect."""

from __future__ import annotations

import re
import textwrap

import pytest
from conftest import MODELS, run_main

from passes.graph_view import step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.frontend import import_graph, load_model_file, trace_model


def write(tmp_path, text: str, name: str = "model.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_missing_file():
    with pytest.raises(PhazeError, match="no such file"):
        load_model_file("does/not/exist.py")


def test_syntax_error_names_line(tmp_path):
    p = write(tmp_path, "def get_model(:\n    pass\n")
    with pytest.raises(PhazeError, match=r"model.py:1:\d+: syntax error"):
        load_model_file(p)


def test_missing_get_model(tmp_path):
    p = write(tmp_path, "def get_inputs(b):\n    return ()\n")
    with pytest.raises(PhazeError, match="defines no get_model"):
        load_model_file(p)


def test_data_dependent_control_flow_names_the_line(tmp_path):
    p = write(
        tmp_path,
        """
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                y = self.lin(x)
                if y.sum() > 0:
                    return y.sum()
                return -y.sum()

        def get_model():
            return M()

        def get_inputs(b):
            return (torch.zeros(b, 4),)
    """,
    )
    spec = load_model_file(p)
    with pytest.raises(PhazeError) as info:
        trace_model(spec, 1)
    assert "data-dependent control flow" in str(info.value)
    assert "model.py:11" in str(info.value) and "if y.sum() > 0" in str(info.value)


def test_tiny_gpt2_training_graph(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    ops = list(fn.body.block.ops)
    phases = {o.attributes[keys.PHASE].data for o in ops if keys.PHASE in o.attributes}
    assert phases == {"fwd", "bwd", "opt"}
    # Every linear layer has one forward, one input-gradient and one weight-gradient GEMM.
    mms = [o for o in ops if isinstance(o, ph.MatmulOp)]
    fwd = [o for o in mms if o.attributes[keys.PHASE].data == "fwd"]
    bwd = [o for o in mms if o.attributes[keys.PHASE].data == "bwd"]
    assert len(bwd) == 2 * len(fwd)
    # Backward GEMMs are attributed to the module of their forward GEMM.
    c_fc = {o.attributes[keys.MODULE].data for o in mms if "mlp.c_fc" in o.attributes[keys.MODULE].data}
    assert c_fc == {"transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_fc"}
    counts = {}
    for o in mms:
        key = (o.attributes[keys.MODULE].data, o.attributes[keys.PHASE].data)
        counts[key] = counts.get(key, 0) + 1
    assert counts[("transformer.h.0.mlp.c_fc", "fwd")] == 1
    assert counts[("transformer.h.0.mlp.c_fc", "bwd")] == 2
    # One gradient and one optimizer update per parameter.
    n_params = sum(1 for a in fn.arg_attrs.data if "phaze.param" in a.data)
    assert sum(1 for o in ops if isinstance(o, ph.OptimizerUpdateOp)) == n_params
    grads = [a for a in fn.res_attrs.data if keys.GRAD in a.data]
    assert len(grads) == n_params


def test_the_imported_step_verifies():
    """The importer builds its ops without IRDL's check of each argument at construction
    (``importer._op``): each op of every kind it builds so must still be what its
    definition asks (operands, results, properties)."""
    spec = load_model_file(MODELS / "tiny_gpt2.py")
    module = import_graph(trace_model(spec, 2))
    kinds = {type(o) for o in module.walk()}
    assert {ph.ElementwiseOp, ph.LayoutOp, ph.ReductionOp, ph.SoftmaxOp, ph.NormOp, ph.EmbeddingOp} <= kinds
    module.verify()


def test_forward_only_import_has_no_backward():
    spec = load_model_file(MODELS / "tiny_gpt2.py")
    module = import_graph(trace_model(spec, 2, training=False))
    fn = step_function(module)
    assert fn.sym_name.data == "forward"
    assert {o.attributes[keys.PHASE].data for o in fn.body.block.ops if keys.PHASE in o.attributes} == {"fwd"}
    ids = [a for a, attrs in zip(fn.body.block.args, fn.arg_attrs.data) if "phaze.input" in attrs.data]
    assert ids[0].type.get_shape() == (2, 16)


def test_seq_len_override_changes_shapes():
    spec = load_model_file(MODELS / "tiny_gpt2.py")
    module = import_graph(trace_model(spec, 1, seq_len=8, training=False))
    assert module.attributes["phaze.seq_len"].value.data == 8


def test_unknown_op_is_opaque_with_warning_and_strict_errors(tmp_path, capsys):
    p = write(
        tmp_path,
        """
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                return torch.special.i0(self.lin(x)).sum()

        def get_model():
            return M()

        def get_inputs(b):
            return (torch.zeros(b, 4),)
    """,
    )
    spec = load_model_file(p)
    traced = trace_model(spec, 1, dtype="float32")
    with pytest.warns(PhazeWarning) as caught:  # i0 and its derivative i1
        module = import_graph(traced)
    pattern = r"unknown aten op aten\.i0\S* \(1x, first in module '<root>'\)"
    assert any(re.search(pattern, str(w.message)) for w in caught)
    opaque = [o for o in module.walk() if isinstance(o, ph.OpaqueOp)]
    assert opaque and opaque[0].aten.data.startswith("aten.i0")
    module.verify()
    with pytest.raises(PhazeError, match="unknown aten op aten.i0"):
        import_graph(traced, strict=True)
    # The plan sweep imports the model at every micro-batch size: phazec says it once.
    r = run_main("phazec", p, "--hw", "tpuv4", "--tp", "1", "-q", "--dtype", "float32")
    assert r.stderr.count("warning: unknown aten op aten.i0") == 1, r.stderr
    assert re.search(r"^phazec: warning: unknown aten op aten\.i0", r.stderr, flags=re.M)


def test_fused_attention_is_expanded_into_matmuls(capsys):
    """transformers' default (sdpa) attention becomes matmul/softmax semantics, not opaque ops:
    2 GEMMs forward, 5 backward (flash attention recomputes QKᵀ), saving only q, k, v, out, lse."""
    spec = load_model_file(MODELS / "tiny_llama_sdpa.py")
    module = import_graph(trace_model(spec, 1), strict=True)
    assert "unknown aten op" not in capsys.readouterr().err
    fn = step_function(module)
    attn = [
        o
        for o in fn.body.block.ops
        if isinstance(o, ph.MatmulOp) and o.attributes[keys.MODULE].data == "model.layers.0.self_attn"
    ]
    phases = [o.attributes[keys.PHASE].data for o in attn]
    assert phases.count("fwd") == 2 and phases.count("bwd") == 5
    s, heads = 32, 4
    scores = [o for o in attn if o.result.type.get_shape() == (1, heads, s, s)]
    assert scores  # the s x s scores exist, with all query heads (kv heads repeated)
    module.verify()

"""scripts/ab_decode.step_work: what one decode step costs the CPU, counted instead of timed."""
from inference_internals.generate import generate_stream
from inference_internals.model import LlamaConfig, random_model
from scripts.ab_decode import step_work

TINY = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def stream_of(model, busy: int = 0, extra_ops: int = 0):
    def stream(prompt, n):
        for nxt in generate_stream(model, prompt, n, stop_ids=[]):
            for _ in range(busy):  # Python work the step does on top
                pass
            for _ in range(extra_ops):
                nxt + 0
            yield nxt
    return stream


def test_counts_are_the_same_on_every_run_and_grow_with_the_work():
    model = random_model(TINY)
    prompt = [1, 2, 3]
    plain = step_work(stream_of(model), prompt)
    assert plain == step_work(stream_of(model), prompt)  # counted, so the machine's load cannot move it
    assert plain["aten_ops"] > 0 and plain["python_bytecodes"] > plain["bytecodes_in_torch_nn"] > 0
    busy = step_work(stream_of(model, busy=100), prompt)
    assert busy["python_bytecodes"] > plain["python_bytecodes"] + 100 and busy["aten_ops"] == plain["aten_ops"]
    ops = step_work(stream_of(model, extra_ops=5), prompt)
    assert ops["aten_ops"] == plain["aten_ops"] + 5

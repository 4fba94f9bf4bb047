# vLLM's offline quickstart, run on this course's engine. On vLLM the first line is
#     from vllm import LLM, SamplingParams
# and nothing else changes (tests/test_production_page.py checks both).
from inference_internals import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct")

outputs = llm.generate(prompts, sampling_params)

for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")

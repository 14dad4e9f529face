"""Build a tiny random-weight Llama model and a locally trained byte-level BPE tokenizer.

No model hub is reachable on the machines this project is developed and tested on, so the local default
serves a model built here: a few MB of random weights in the Llama architecture, with a tokenizer trained on
text shipped in this repository and a chat template. The output is a normal Hugging Face folder that vLLM
loads like any other. Its text is gibberish; every code path a production model takes is real.
"""

from replicas.tiny_model.build import TinyModelSpec, build_tiny_model

__all__ = ["TinyModelSpec", "build_tiny_model"]

"""Export: files other engines read, written from what vocgraft knows about the tokenizer it built.

``to_gguf``: :func:`~vocgraft.export.to_gguf.export_gguf`, a model directory -> one GGUF file for llama.cpp.
``tokenizer``: how llama.cpp can run a tokenizer.json, and whether it gives the same ids.
``sentencepiece``: llama.cpp's SentencePiece tokenizer (its byte-level pre-tokenizer types are
:mod:`vocgraft.tokenization.llama_cpp_types`, which reading a GGUF file uses too).
``architecture``: hyperparameters and tensors in llama.cpp's conventions.
``mismatch``: how much text a tokenizer and llama.cpp's nearest counterpart tokenize differently.
"""

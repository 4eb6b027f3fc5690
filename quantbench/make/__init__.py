"""Making models: everything that writes a model rather than reads one.

    fixture.py            the embedded default model (a tiny Qwen3-MoE, trained here: `quantbench fixture`)
    omni_fixture.py       the omni default model (a tiny Qwen3-Omni thinker; its towers trained by
    omni_fixture_train.py   omni_fixture_train.py)
    quantize/             `quantbench quantize`: variants made with auto-round and ModelOpt, and their cache
    plant.py              `quantbench plant`: a planted tower regression

Reading a model (checkpoints, families, loaders, the synthetic shapes built from a seed) is quantbench.models. The
measuring side never imports this package: a backend's `load()` and the run's child process only read what the
parent made before them (quantbench.run.resolve), and importing a quantizing library changes how transformers
loads models in that process. An import-linter contract in pyproject.toml holds it.
"""

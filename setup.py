import os
import re

from setuptools import find_packages, setup

# One source of truth: the version users see as treadle.__version__ (read, not
# imported: importing treadle needs torch, which may not be installed yet).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "treadle", "__init__.py"), encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

setup(
    name="treadle",
    version=VERSION,
    description="A hook-based training iteration engine for PyTorch",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["treadle", "treadle.*"]),
    # The digits data ships with the package: the default example runs offline.
    # So do the example and common configs: get_config and the default job find them installed.
    package_data={
        # PEP 561: mypy reads an installed treadle's types (the Trainer's settings).
        "treadle": ["py.typed"],
        "treadle.data.datasets": ["files/*.csv.gz", "files/README.md"],
        "treadle.model_zoo": ["configs/*.py", "configs/common/*.py", "configs/common/data/*.py",
                              "configs/common/models/*.py"],
    },
    install_requires=[
        # The oldest release tried (noxfile.py's oldest session: Python 3.10); torch 2.6
        # lacks what DCP checkpoints and FSDP2 use (dcp.save's no_dist, async stagers).
        "torch>=2.13",
        "fvcore>=0.1.5",
        "iopath>=0.1.9",
        "omegaconf>=2.3",
        "tabulate",
        "termcolor",
        "tensorboard",
        "numpy",
        "PyYAML",
        "tqdm",
        # Reading .safetensors weights and Hugging Face model folders, and
        # exporting model_final.safetensors: a small, dependency-free format
        # library that Hugging Face maintains.
        "safetensors",
        # Unpack, which types the plain Trainer's **settings (typing has it from Python 3.11 only).
        "typing_extensions>=4.10",
    ],
    extras_require={
        "plot": ["matplotlib"],
        # transformers and torchmetrics: the tests train a Hugging Face model built
        # from a config and evaluate with torchmetrics (both optional for users).
        # mlflow and wandb: the tests run the MLflow and W&B writers against
        # their real clients (a local MLflow server, W&B offline).
        # ruff and mypy: the lint and type checks .ci/run runs (configured in pyproject.toml).
        # seqeval: the tests check the "seqeval" metric against seqeval's own functions.
        "dev": ["pytest", "matplotlib", "transformers", "torchmetrics", "mlflow", "wandb", "ruff", "mypy", "seqeval"],
        "metrics": ["torchmetrics"],
        # The "seqeval" metric (entity-level precision/recall/F1 of token
        # classification, Hezar's): entities are read from IOB tags by seqeval.
        "seqeval": ["seqeval"],
        # The documentation site: python -m sphinx -W -n --keep-going -b html docs docs/_build/html
        # (.ci/run builds it; every reference must resolve).
        "docs": ["sphinx", "myst-parser", "furo"],
        # The peers that benchmarks/peers.py runs beside treadle, when installed
        # (never a CI dependency).
        "bench": ["pytorch-ignite", "accelerate", "mmengine", "pytorch-accelerated", "lightning"],
        # Experiment trackers, for MLflowWriter and WandbWriter (train.writers.*).
        "mlflow": ["mlflow"],
        "wandb": ["wandb"],
    },
    entry_points={
        "console_scripts": [
            "treadle-train=treadle.tools.script:main",
            "treadle-plot=treadle.tools.plot_metrics:main",
        ]
    },
)

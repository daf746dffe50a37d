"""speculative: exact speculative decoding (Leviathan et al. 2023) and SpecTr in JAX/Flax.

Install for development and tests:  pip install -e '.[test]'
"""

from setuptools import find_packages
from setuptools import setup

# Versions that install together on a CPU-only Linux machine with Python 3.11 (docs/design.md section 8).
# The jax family is pinned here too (its versions must match); constraints.txt pins every package
# exactly (the Makefile installs with it).
INSTALL_REQUIRES = [
  "jax==0.10.2",
  "jaxlib==0.10.2",
  "flax==0.12.8",
  "optax==0.2.8",
  "chex==0.1.92",
  "numpy>=1.26,<3",
  "scipy>=1.11",
  "gin-config==0.5.0",
  "msgpack>=1.0",
  "tensorstore==0.1.86",
  "sentencepiece==0.2.1",
  "sacrebleu==2.6.0",
  "rouge-score==0.1.2",
  "tqdm>=4.66",
  "matplotlib>=3.8",
  "seqio==0.0.20",
  "tensorflow==2.21.0",
  "tensorflow-text==2.21.1",
  # TFDS's DatasetBuilder imports it (lazily) when it prepares the paper's WMT/CNN-DM datasets but
  # does not declare it: without it, preparing wmt_t2t_translate fails with ModuleNotFoundError.
  "importlib_resources>=6.0",
]

setup(
  name="speculative",
  version="0.1.0",
  description="Exact speculative decoding and SpecTr for T5X-style models in JAX/Flax",
  packages=find_packages(include=["speculative", "speculative.*"]),
  python_requires=">=3.10",
  install_requires=INSTALL_REQUIRES,
  extras_require={"test": ["pytest==9.0.3", "pytest-xdist==3.8.0", "ruff==0.17.6"]},
  entry_points={
    "console_scripts": [
      "speculative-infer=speculative.infer:main",
      "speculative-benchmark=speculative.benchmark:main",
      "speculative-train=speculative.train:main",
    ]
  },
)

"""Install: ``pip install -e .`` (extras: ``[vllm]``, ``[megatron]``, ``[test]``)."""
from setuptools import find_packages, setup

setup(
    name="dsrl",
    version="0.1.0",
    description="A DeepSpeed-centric, fork-friendly RL post-training framework for LLMs (PPO, GRPO and relatives)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["trainer*", "patches*", "rollout*", "rewards*", "tools*"]),
    package_data={"": ["*.yaml"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.4",
        "transformers>=5.17,<6",
        "deepspeed==0.19.*",
        "accelerate>=1.1.0",  # transformers' HfDeepSpeedConfig (ZeRO-3 partitioned loading) needs it
        "ray",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "datasets",
        "pyarrow",
        "tensordict",
        "tokenizers",
        "safetensors",
        "numpy",
        "wandb",
        "tqdm",
        "math-verify",
        "matplotlib",
        "peft>=0.17",  # LoRA adapters (actor_rollout_ref.model.lora_rank)
    ],
    extras_require={
        "vllm": ["vllm>=0.8.5"],
        # megatron-core 0.17+ needs Python >= 3.12; 0.16 is the newest that installs on 3.11
        "megatron": ["megatron-core>=0.16,<0.20"],
        # megatron-core 0.16 runs the Megatron tests on CPU (gloo) and is the newest release for Python 3.11
        "test": ["pytest", "pytest-xdist>=3.5,<4", "hypothesis", "megatron-core>=0.16,<0.17"],
        "bench": ["trl"],
    },
)

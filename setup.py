from setuptools import find_packages, setup

setup(
    name="slora_vtc",
    version="0.1.0",
    description="Fair scheduling (VTC) on an S-LoRA-style continuous-batching LLM engine",
    python_requires=">=3.10",
    packages=[*find_packages(include=["slora_vtc", "slora_vtc.*"]), "slora_vtc_kernels"],
    package_dir={"slora_vtc_kernels": "kernels"},
    install_requires=["numpy", "pandas", "matplotlib", "tqdm"],
    extras_require={
        "real": ["torch", "triton", "transformers", "safetensors", "peft"],
        "serve": [
            "fastapi",
            "uvicorn",
            "httptools",
            "uvloop; sys_platform != 'win32'",
            "prometheus_client",
            "httpx2",
            "aiohttp",
            "tomli; python_version < '3.11'",
        ],
    },
    entry_points={"console_scripts": ["slora-vtc=slora_vtc.cli:main"]},
)

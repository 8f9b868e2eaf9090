from setuptools import setup

setup(
    name="slora_vtc",
    version="0.1.0",
    description="Fair scheduling (VTC) on an S-LoRA-style continuous-batching LLM engine",
    python_requires=">=3.10",
    packages=["slora_vtc", "slora_vtc.backends", "slora_vtc.figures", "slora_vtc.memory", "slora_vtc.sched", "slora_vtc.traces", "slora_vtc.model", "slora_vtc.server", "slora_vtc_kernels"],
    package_dir={"slora_vtc_kernels": "kernels"},
    install_requires=["numpy", "pandas", "matplotlib", "tqdm"],
    extras_require={"real": ["torch", "triton", "transformers", "safetensors"],
                    "serve": ["fastapi", "uvicorn", "prometheus_client", "httpx2", "tomli; python_version < '3.11'"]},
    entry_points={"console_scripts": ["slora-vtc=slora_vtc.cli:main"]},
)

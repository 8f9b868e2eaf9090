"""What the tests share, one module per concern, imported by name (`from tests.helpers.engine import
make_engine`); tests/README.md lists them. Only engine, sched, files and cli are on the simulator path:
server, gateway and llama import torch or the HTTP stack."""

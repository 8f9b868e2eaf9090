"""Turn `{{SOURCE:PATH[|FORMAT]}}` placeholders of a draft into docs markers, then refresh them.

    python scripts/markers.py paper_repro.md    # rewrites the file in place

An authoring aid: `slora-vtc docs` keeps the markers current afterwards.
"""

import re
import sys
from pathlib import Path

from slora_vtc.docs import Numbers, refresh_text

PLACEHOLDER = re.compile(r"\{\{([^}|]+)(\|[^}]*)?\}\}")

for name in sys.argv[1:]:
    path = Path(name)
    text = PLACEHOLDER.sub(lambda m: f"<!--n:{m[1]}{m[2] or ''}-->?<!--/n-->", path.read_text())
    path.write_text(refresh_text(text, Numbers(), name))

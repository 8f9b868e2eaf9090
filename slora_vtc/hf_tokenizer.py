"""Loading a Hugging Face tokenizer from a local folder, offline (the server and trace building)."""

from pathlib import Path

from slora_vtc.errors import UserError


def load_hf_tokenizer(path: str | Path):
    """AutoTokenizer from local files only; a missing or unreadable folder is a UserError."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"{path}: tokenizer folder not found")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot load a tokenizer from this folder ({str(e).splitlines()[0]})") from None

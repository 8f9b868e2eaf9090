from slora_vtc.cli import main

if __name__ == "__main__":  # not when a spawned process (serve's engine process) imports it
    raise SystemExit(main())

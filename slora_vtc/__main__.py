from slora_vtc.cli import main

raise SystemExit(main())

"""`python -m servers.diagnostics` serves the diagnostics server over stdio."""

from servers.cli import main

if __name__ == "__main__":
    main(["serve", "diagnostics"])

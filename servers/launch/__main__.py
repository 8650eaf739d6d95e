"""`python -m servers.launch` serves the launch server over stdio."""

from servers.cli import main

if __name__ == "__main__":
    main(["serve", "launch"])

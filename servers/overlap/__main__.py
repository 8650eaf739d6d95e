"""`python -m servers.overlap` serves the overlap server over stdio."""

from servers.cli import main

if __name__ == "__main__":
    main(["serve", "overlap"])

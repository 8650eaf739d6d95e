"""`python -m servers.scaling` serves the scaling server over stdio."""

from servers.cli import main

if __name__ == "__main__":
    main(["serve", "scaling"])

from ._cli.main import main

main()

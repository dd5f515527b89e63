from kerneljudge.cli.app import main

main()

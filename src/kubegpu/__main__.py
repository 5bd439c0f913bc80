from kubegpu.cli import main

main()
